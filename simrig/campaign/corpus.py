"""The traces a fuzz campaign replays before its examples.

First the regressions (every shrunk failure found so far), then, for a
steered campaign, the coverage corpus earlier campaigns kept
(``simrig.campaign.steering``). A class such a trace shows already has its
minimal trace, so it is tolerated from the first example on.
"""

from __future__ import annotations

from pathlib import Path

from simrig.campaign.options import FindingClass
from simrig.campaign.shrink import class_key, replay_with_checks
from simrig.findings.classes import Where
from simrig.findings.findings import Finding
from simrig.trace_io.trace import TraceError, trace_files_in


class TraceReplays:
    """The trace-replay phases of ``simrig.campaign.fuzz.Campaign``."""

    def replay_regressions(self) -> None:
        folder = Path(self.options.regressions_dir)
        for path in trace_files_in(folder) if folder.is_dir() else []:
            if self.interrupted:
                return
            found, num_steps = replay_with_checks(path, self.options.extra_checks,
                                                  self.options.stages, stop=lambda: self.interrupted)
            self.stats.regression_traces += 1
            self.stats.regression_steps += num_steps
            self._record_trace_findings(path, found)  # before any example

    def _record_trace_findings(self, path: Path, found: list[Finding]) -> None:
        """Findings of a whole trace replayed before the examples (a regression or
        a corpus trace): that trace is each new class's reproducer, so the class
        is tolerated (it already has a minimal trace: never shrunk again)."""
        where = Where(str(path), elapsed_s=self._elapsed())
        for f in found:
            self.tally.add(f, where)
            key = class_key(f)
            cls = self.classes.get(key)
            if cls is None:
                cls = self.classes[key] = FindingClass(key, f, source=str(path),
                                                       trace_path=str(path), reproduced=True)
                self._notify(cls)
            cls.count += 1
            self.tolerated.add(key)

    def replay_corpus(self) -> None:
        """Examples earlier steered campaigns kept for reaching new arcs, first
        (their findings count as the campaign's; their arcs are reached at once)."""
        for path in trace_files_in(Path(self.options.corpus_dir)):
            if self.interrupted:
                return
            if not path.name.startswith(f"{self.options.mode}-"):
                continue
            try:
                found, num_steps = replay_with_checks(path, self.options.extra_checks, self.options.stages,
                                                      stop=lambda: self.interrupted)
            except (TraceError, ValueError):
                continue  # a corpus file this release or format cannot take: skipped
            self.corpus_replayed += 1
            self.stats.regression_steps += num_steps
            self._record_trace_findings(path, found)
        if self.coverage.collector is not None:
            fresh = self.coverage.collector.take()
            self._seen_arcs |= {(p, a, b) for p, pairs in fresh.items() for a, b in pairs}
