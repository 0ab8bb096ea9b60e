"""``simrig replay`` in forked workers: a trace that kills its process is a finding.

The replay's units are its traces x PCP sizes, in order (``replay_traces``).
A worker replays the units not yet done, checkpointing its recorder after
each unit and whenever a class appears in one; when a worker dies (a signal,
an OOM kill) or hangs, the unit it was in becomes a ``crash`` class (signal,
stage, step; its reproducer is that trace at that PCP size) and the next
worker resumes from the checkpoint, past that unit:

    units  0 trace_a pcp=1   done ─► checkpoint
           1 trace_a pcp=2   SIGSEGV at step 7 (prepare) ─► crash class, skipped
           2 trace_b pcp=1   replayed by the next worker
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from simrig import lifeline as lifeline_mod
from simrig.findings.classes import Where
from simrig.findings.findings import Finding
from simrig.report.recorder import ReplayRecorder
from simrig.supervision import forked
from simrig.trace_io.trace import TraceReader

CRASH = "crash"


def replay_units(paths: Sequence[str | Path], pcp_sizes: Sequence[int] | None) -> list[tuple[str, int]]:
    """(trace, PCP size) of each unit, in the order ``replay_traces`` replays them."""
    units = []
    for path in paths:
        reader = TraceReader(path)
        own = reader.header.config.pcp_size
        reader.close()
        units += [(str(path), size) for size in (pcp_sizes or [own])]
    return units


class UnitBook:
    """A worker's side: which units to skip, and the checkpoints of its recorder."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        saved = forked.load(self.state_dir / "checkpoint.pkl")
        self.done_units: set[int] = set(saved["done"]) if saved else set()
        self.recorder: ReplayRecorder = saved["recorder"] if saved else ReplayRecorder()
        self.crashes: list[dict[str, Any]] = forked.load(self.state_dir / "crashes.pkl") or []
        applied = saved["applied_crashes"] if saved else 0
        for crash in self.crashes[applied:]:
            add_crash(self.recorder, crash)
            self.done_units.add(crash["unit"])
        self._classes = len(self.recorder.classes.classes)

    def skip(self, unit: int) -> bool:
        return unit in self.done_units

    def after_step(self, unit: int) -> None:
        if len(self.recorder.classes.classes) != self._classes:  # a class is never lost
            self.checkpoint()

    def done(self, unit: int) -> None:
        self.done_units.add(unit)
        self.checkpoint()

    def checkpoint(self) -> None:
        self._classes = len(self.recorder.classes.classes)
        forked.dump(self.state_dir / "checkpoint.pkl", {
            "done": sorted(self.done_units), "recorder": self.recorder,
            "applied_crashes": len(self.crashes)})


def add_crash(rec: ReplayRecorder, crash: dict[str, Any]) -> None:
    """The unit a worker died in, as one ``crash`` occurrence of the replay."""
    step = max(int(crash["step"]), 0)
    finding = Finding(kind=CRASH, step=step, stage=crash["stage"], check="supervisor",
                      exception_type=crash["signal"], trace=crash["trace"],
                      message=f"the replay's worker died ({crash['detail']}) in "
                              f"{crash['stage'] or 'an unknown stage'} at step {step} of "
                              f"{crash['trace']} (pcp={crash['pcp_size']}); simrig went on with "
                              "the next trace")
    row = finding.row()
    row.update(pcp_size=crash["pcp_size"], verdict="new")
    rec.findings.append(row)
    rec.classes.add(finding, Where(crash["trace"], crash["pcp_size"], replay_args=tuple(crash["args"])))
    rec.num_findings += 1
    rec.num_new += 1
    rec.first_findings.insert(0, finding)


def run_supervised(paths: Sequence[str | Path], pcp_sizes: Sequence[int] | None,
                   replay_args: Callable[[str, int], tuple[str, ...]], out_dir: Path,
                   work: Callable[[UnitBook], int], *, timeout_s: float | None = None) -> int:
    """``work(book)`` replays and writes the report in a forked worker (passing ``book``
    to ``replay_traces(units=...)``); its exit status is the command's."""
    units = replay_units(paths, pcp_sizes)
    crashes: list[dict[str, Any]] = []

    def in_worker(state_dir: Path, last: bool, _elapsed: float) -> int:
        book = UnitBook(state_dir)
        if last:  # too many crashes: the rest is not replayed, the report is written
            book.done_units.update(range(len(units)))
        return work(book)

    def on_crash(state_dir: Path, reading: lifeline_mod.Reading, what: str) -> str:
        unit = reading.example if 0 <= reading.example < len(units) else 0
        trace, size = units[unit]
        crashes.append({"unit": unit, "trace": trace, "pcp_size": size, "step": reading.step,
                        "stage": reading.stage, "signal": forked.crash_kind(what), "detail": what,
                        "args": replay_args(trace, size)})
        forked.dump(state_dir / "crashes.pkl", crashes)
        return f"in {reading.stage or '?'} at step {max(reading.step, 0)} of {trace} (pcp={size})"

    return forked.supervise("replay", out_dir, in_worker, on_crash, timeout_s=timeout_s)
