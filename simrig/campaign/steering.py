"""Coverage in a fuzz campaign: the arcs each example reached, steering, the corpus kept.

With ``--coverage`` every example's MRV2 arcs go into the campaign's coverage
timeline; with ``--steer`` Hypothesis' ``target()`` climbs on their number and
an example that reached an arc no earlier one did is kept as a trace in the
corpus folder, replayed first by the next steered campaign
(``simrig.campaign.corpus``). ``plateau`` says when the arcs stopped growing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from simrig.coverage.session import CoverageRun
from simrig.trace_io.trace import TraceHeader, write_trace


class CoverageSteering:
    """The coverage part of ``simrig.campaign.fuzz.Campaign``."""

    def _init_coverage(self, options: Any) -> None:
        self.coverage = CoverageRun(options.coverage, fail_on_unexplained=options.fail_on_unexplained_coverage,
                                    reasons_path=options.unreached)
        self.unexplained_lines = 0  # set when the report is written
        self.coverage_timeline: list[dict[str, Any]] = []  # per example: cumulative MRV2 arcs
        self._seen_arcs: set[tuple[str, int, int]] = set()
        self.corpus_kept = self.corpus_replayed = 0

    def _coverage_example(self, machine: Any) -> None:
        """The arcs this example reached: the coverage timeline; with steering,
        Hypothesis' target() on their number, and the example kept in the corpus
        when it reached an arc no earlier example did."""
        fresh = self.coverage.collector.take()
        arcs = {(path, a, b) for path, pairs in fresh.items() for a, b in pairs}
        new = arcs - self._seen_arcs
        self._seen_arcs |= arcs
        self.coverage_timeline.append({"example": self.stats.examples, "elapsed_s": round(self._elapsed(), 3),
                                       "steps": self.stats.steps, "arcs_in_example": len(arcs),
                                       "new_arcs": len(new), "arcs_total": len(self._seen_arcs)})
        if not self.options.steer:
            return
        from hypothesis import target  # lazy: hypothesis loads only when this runs

        target(float(len(arcs)), label="MRV2 arcs reached by the example")
        if new and self.options.corpus_dir is not None:
            self._keep(machine, len(new))

    def _keep(self, machine: Any, new: int) -> None:
        folder = Path(self.options.corpus_dir)
        header = TraceHeader(config=machine.config, adversarial=self.options.mode == "adversarial",
                             source={"kind": "generated", "corpus": "coverage", "new_arcs": new,
                                     "violation_steps": {str(k): v for k, v in machine.violations.items()},
                                     "description": "a fuzz example that reached MRV2 arcs no earlier "
                                                    "example of its campaign had (simrig fuzz --steer)"})
        text = repr((machine.config, machine.steps)).encode()
        path = folder / f"{self.options.mode}-{hashlib.sha1(text).hexdigest()[:12]}.jsonl"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                write_trace(path, header, list(machine.steps))
                self.corpus_kept += 1
        except OSError:
            pass  # a corpus that cannot be written costs its examples only


def plateau(timeline: list[dict[str, Any]], share: float = 0.95) -> dict[str, Any]:
    """When the campaign's examples stopped adding MRV2 arcs: the time of the last
    new arc and the time ``share`` of the final count was first reached."""
    if not timeline:
        return {"coverage_last_new_arc_s": None, "coverage_95_s": None}
    final = timeline[-1]["arcs_total"]
    last_new = max((r["elapsed_s"] for r in timeline if r["new_arcs"]), default=0.0)
    at_share = next((r["elapsed_s"] for r in timeline if r["arcs_total"] >= share * final), None)
    return {"coverage_last_new_arc_s": last_new, "coverage_95_s": at_share}
