"""One ``simrig replay`` run, from checked arguments to its exit status.

``run`` replays in this process (``SIMRIG_SUPERVISE=0``), in forked workers
(``simrig.supervision.replay_workers``: a trace that kills its process is a crash class) or on
Ray workers (``simrig.distributed.replay_shards``); each ends in ``report``: the report
folder, the history row, ``--summary-md``, and the lines (or ``--json``) on stdout.
The command line itself is ``simrig.cli.replay_cmd``'s.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simrig.adapters.runner import load
from simrig.coverage.session import CoverageRun, coverage_line, without_coverage_data
from simrig.distributed import replay_shards
from simrig.errors import EXIT_INTERRUPTED
from simrig.findings.classes import class_rows_for_print, verdict_counts, verdict_line
from simrig.history.changes import changes_line, since_previous
from simrig.history.store import record_history
from simrig.interrupt import StopRequests
from simrig.progress import Progress
from simrig.replay import ReplayRecorder, recorded_result, replay_args, replay_traces
from simrig.report.html import emit_json
from simrig.report.timing import time_share_line
from simrig.report.writer import write_report, write_summary_md
from simrig.supervision import forked
from simrig.supervision.replay_workers import run_supervised
from simrig.trace_io.trace import TraceReader
from simrig.vllm_runtime.interpreter_patches import memcheck_ran


@dataclass
class ReplayRun:
    """What one ``simrig replay`` was asked, every argument checked."""
    traces: list[str]  # the TRACE arguments as given (the history's suite name)
    paths: list[Path]
    pcp_sizes: list[int] | None
    stages: tuple[str, ...]
    cudagraph_mode: str | None
    total: int  # steps to replay, for the progress line
    out: Path
    coverage: CoverageRun
    progress: str | None  # the --progress mode
    summary_md: str | None
    json: bool
    started: float  # time.perf_counter() when the command started


def run(r: ReplayRun, *, workers: int | None = None, ray: str | None = None,
        segment_steps: int | None = None, step_timeout: float | None = None) -> int:
    """The replay and its report: on ``workers`` Ray workers, or supervised (unless
    SIMRIG_SUPERVISE=0: in this process, for a debugger or a profiler)."""
    if workers is not None:
        return replay_sharded(r, workers, ray, segment_steps)
    if not forked.enabled():
        return replay_here(r, None)

    def unit_args(trace: str, size: int) -> tuple[str, ...]:
        reader = TraceReader(trace)
        own = reader.header.config
        reader.close()
        return replay_args(own, own.replayed_as(size, r.cudagraph_mode), r.stages)

    # in forked workers: a trace that kills its process is a crash class, the replay goes on
    return run_supervised(r.paths, r.pcp_sizes, unit_args, r.out, lambda book: replay_here(r, book),
                          timeout_s=step_timeout)


def replay_here(r: ReplayRun, book: Any) -> int:
    """The replay and its report in this process: a supervised worker's (``book``, a
    ``simrig.supervision.replay_workers.UnitBook``: its recorder and the units to skip) or the
    command's own (``book`` None)."""
    recorder = book.recorder if book is not None else ReplayRecorder()
    progress = Progress(sys.stderr, mode=r.progress, total=r.total)
    with StopRequests() as stop:
        try:
            load()  # vLLM's import is not measured: only what the replay reaches
            r.coverage.start()
            try:
                result = replay_traces(r.paths, pcp_sizes=r.pcp_sizes, stages=r.stages, progress=progress,
                                       cudagraph_mode=r.cudagraph_mode, recorder=recorder,
                                       stop=lambda: stop.requested, units=book)
            except KeyboardInterrupt:  # a second Ctrl-C: the step in flight is dropped
                result = recorded_result(recorder, r.paths, r.pcp_sizes or [], r.stages)
        finally:
            r.coverage.stop()
            progress.close()
        with stop.shield():  # a Ctrl-C now would cost the report: ignored until it is written
            return report(r, result, interrupted=stop.requested)


def replay_sharded(r: ReplayRun, workers: int, ray: str | None, segment_steps: int | None) -> int:
    """``--workers N``: trace x PCP size x segment units on Ray workers, one report."""
    progress = Progress(sys.stderr, mode=r.progress, total=r.total)
    with StopRequests() as stop:
        try:
            sharded = replay_shards.replay_sharded(r.paths, workers=workers, address=ray, pcp_sizes=r.pcp_sizes,
                                                   stages=r.stages, segment_steps=segment_steps,
                                                   progress=progress, cudagraph_mode=r.cudagraph_mode,
                                                   stop=lambda: stop.requested, coverage=r.coverage.enabled)
            for unit in sharded.units:
                r.coverage.add(unit.coverage)
        finally:
            r.coverage.stop()
            progress.close()
        with stop.shield():  # a Ctrl-C now would cost the report: ignored until it is written
            return report(r, sharded.result, interrupted=stop.requested, workers=workers,
                          sharded=sharded)


def report(r: ReplayRun, result: Any, interrupted: bool, workers: int | None = None,
           sharded: Any = None) -> int:
    """The report folder, the history row (not for an interrupted replay), --summary-md and
    what the command prints; returns the exit status."""
    summary = {"command": "replay", "suite": "replay " + " ".join(map(_short_path, r.traces)),
               **result.summary()}
    summary["elapsed_s"] = round(time.perf_counter() - r.started, 3)
    summary["exit_status"] = result.exit_status
    # as it ran where the kernels ran (the registry's entry), not as the flag asked
    summary["memcheck"] = (bool(sharded.units) and all(u.memcheck for u in sharded.units)
                           if sharded is not None else memcheck_ran())
    if interrupted:  # the report holds every step replayed before the stop; the rest was not judged
        summary["stopped_by"] = "signal"
        summary["exit_status"] = EXIT_INTERRUPTED
    if workers is not None:  # per unit: where it ran and how long its replay took
        summary["workers"] = workers
        summary["units"] = [{"trace": u.unit.path, "pcp_size": u.unit.pcp_size, "start": u.unit.start,
                             "stop": u.unit.stop, "replay_s": round(u.seconds, 3), "worker": u.worker}
                            for u in sharded.units]
    headline = (("INTERRUPTED: " if interrupted else "")
                + f"replayed {summary['steps']:,} steps from {len(r.paths)} trace(s) "
                f"(pcp sizes {','.join(map(str, result.pcp_sizes))}) in {summary['elapsed_s']:.1f} s "
                f"({summary['steps_per_s']:.1f} steps/s), vLLM {result.vllm_version} on {result.device}")
    cov_tables, cov_summary = r.coverage.report_parts()
    summary.update(cov_summary)
    summary["exit_status"] = r.coverage.exit_status(summary["exit_status"], summary)
    summary["since_previous"] = since_previous(summary, result.classes)
    folder = write_report(r.out, result.steps, result.findings, result.contract, summary,
                          classes=result.classes, headline=headline, extra_tables=cov_tables)
    summary["report"] = str(folder)
    summary["classes"] = verdict_counts(result.classes)  # what write_report put in summary.json
    write_summary_md(r.summary_md, "replay", summary, result.classes, headline, str(folder / "report.html"))
    if not interrupted:  # a partial replay says nothing about the classes it did not reach
        record_history(summary, result.classes)
    if r.json:
        emit_json(without_coverage_data(summary))
        return summary["exit_status"]
    print(headline)
    print(f"{verdict_line(summary['classes'])}; occurrences: {summary['new']} new, "
          f"{summary['known']} known, {summary['expected']} expected")
    for line in class_rows_for_print(result.classes):
        print(line)
    if changes_line(summary):
        print(changes_line(summary))
    print(time_share_line(summary["time_share"]))
    if summary.get("steps_after_exception"):
        print(f"  {summary['steps_after_exception']} step(s) ran on a runner vLLM had raised in "
              "(steps.csv: after_exception, the step it raised at); their findings may follow from it")
    if coverage_line(summary):
        print(coverage_line(summary))
    for item in summary.get("unavailable", []):
        print(f"  [unavailable] {item['trace']} pcp={item['pcp_size']}: {item['stage']} "
              f"({item['capability']}): {item['reason']}")
    print(f"report: {folder / 'report.html'}")
    return summary["exit_status"]


def _short_path(path: str) -> str:
    """A trace argument relative to the working directory when inside it (the
    history's suite name should not depend on where the checkout lives)."""
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else rel
