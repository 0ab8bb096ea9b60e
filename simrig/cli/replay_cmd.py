"""``simrig replay TRACE...``: replay traces through the real MRV2 input path.

Every trace is validated in full (header and every step line) before vLLM is
imported, so a bad file anywhere fails in seconds with one line and exit 2,
and no report directory is written.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from simrig.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    from simrig.cli.flags import (add_memcheck_flag, add_output_flags, add_step_timeout_flag,
                                     add_summary_md_flag)

    p = sub.add_parser(
        "replay", help="replay traces through vLLM's real runner input path and report findings",
        description="Replay scheduler-output traces (files, or directories of *.jsonl[.gz|.zst]) "
                    "through the installed vLLM's Model Runner V2 input path, check every step "
                    "and write a report: one row per finding class, verdict new / known / "
                    "expected (a class a trace header's `expect` declares).",
        epilog="exit status: 0 no new finding class (known and expected classes do not fail); "
               "1 a new finding class, or an expected class that did not occur; "
               "2 bad arguments or a malformed trace (one line on stderr, no report); "
               "3 simrig's own code raised (rig_error findings, tracebacks in the report); "
               "130 interrupted by Ctrl-C (the report holds every step replayed before it)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace file or directory")
    p.add_argument("--pcp-sizes", metavar="N,N,...",
                   help="replay each trace once per PCP world size (default: the trace's own)")
    p.add_argument("--cudagraph-mode", metavar="MODE", type=str.upper,
                   help="replay every trace under this vLLM cudagraph mode (NONE, PIECEWISE, FULL, "
                        "FULL_DECODE_ONLY, FULL_AND_PIECEWISE), dispatched and padded by vLLM's own "
                        "CudaGraphManager (default: the trace's own mode)")
    p.add_argument("--stages", metavar="S,S,...",
                   help="optional stages to run: gather,prepare,partition,dummy (default: all; "
                        "lifecycle always runs)")
    add_output_flags(p, "replay")
    add_summary_md_flag(p)
    add_memcheck_flag(p)
    add_step_timeout_flag(p)
    from simrig.coverage.session import add_coverage_flags

    add_coverage_flags(p, default=True)
    from simrig.distributed.cluster import add_distributed_arguments

    add_distributed_arguments(p, "replay trace x PCP size x segment units on N Ray workers")
    p.add_argument("--segment-steps", type=int, default=None, metavar="N",
                   help="with --workers: cut traces longer than N steps into segments, each "
                        "starting with a resync step (default: max(200, total steps / N))")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simrig.cli.flags import memcheck_env

    with memcheck_env(args.memcheck):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from simrig.replay import expand_trace_paths, parse_pcp_sizes, parse_stages, scan_trace
    from simrig.report.writer import check_out_dir, default_out_dir

    started = time.perf_counter()
    pcp_sizes = parse_pcp_sizes(args.pcp_sizes)
    stages = parse_stages(args.stages)
    out = check_out_dir(args.out if args.out else default_out_dir("replay"))
    paths = expand_trace_paths(args.traces)
    from simrig.distributed.cluster import distributed_workers

    workers = distributed_workers(args)
    from simrig.cli.flags import check_step_timeout, check_summary_md

    check_step_timeout(args)
    check_summary_md(args)
    if args.segment_steps is not None and args.segment_steps < 1:
        raise UsageError(f"--segment-steps: must be >= 1, got {args.segment_steps}")
    total = 0
    for path in paths:  # every header and step line, before anything runs
        header, num_steps = scan_trace(path)
        total += num_steps * len(pcp_sizes or [header.config.pcp_size])
        for size in pcp_sizes or [header.config.pcp_size]:
            _check_graph_config(header.config, size, args.cudagraph_mode, path)

    from simrig.coverage.session import CoverageRun

    coverage = CoverageRun.begin(args)  # a malformed reasons file: exit 2 before anything runs
    if workers is not None:
        return _replay_sharded(args, started, paths, pcp_sizes, stages, total, out, coverage, workers)
    from simrig.supervision import forked

    if not forked.enabled():  # SIMRIG_SUPERVISE=0: in this process (a debugger, a profiler)
        return _replay_here(args, started, paths, pcp_sizes, stages, total, out, coverage, None)
    from simrig.replay import replay_args
    from simrig.supervision.replay import run_supervised
    from simrig.trace_io.trace import TraceReader

    def unit_args(trace: str, size: int) -> tuple[str, ...]:
        reader = TraceReader(trace)
        own = reader.header.config
        reader.close()
        return replay_args(own, own.replayed_as(size, args.cudagraph_mode), stages)

    # in forked workers: a trace that kills its process is a crash class, the replay goes on
    return run_supervised(paths, pcp_sizes, unit_args, out,
                          lambda book: _replay_here(args, started, paths, pcp_sizes, stages, total, out,
                                                    coverage, book),
                          timeout_s=args.step_timeout)


def _replay_here(args: argparse.Namespace, started: float, paths: list, pcp_sizes: Any, stages: Any,
                 total: int, out: Any, coverage: Any, book: Any) -> int:
    """The replay and its report in this process: a supervised worker's (``book``, a
    ``simrig.supervision.replay.UnitBook``: its recorder and the units to skip) or the
    command's own (``book`` None)."""
    from simrig.adapters.runner import load
    from simrig.interrupt import StopRequests
    from simrig.progress import Progress
    from simrig.replay import ReplayRecorder, recorded_result, replay_traces
    from simrig.cli.flags import progress_mode

    recorder = book.recorder if book is not None else ReplayRecorder()
    progress = Progress(sys.stderr, mode=progress_mode(args), total=total)
    with StopRequests() as stop:
        try:
            load()  # vLLM's import is not measured: only what the replay reaches
            coverage.start()
            try:
                result = replay_traces(paths, pcp_sizes=pcp_sizes, stages=stages, progress=progress,
                                       cudagraph_mode=args.cudagraph_mode, recorder=recorder,
                                       stop=lambda: stop.requested, units=book)
            except KeyboardInterrupt:  # a second Ctrl-C: the step in flight is dropped
                result = recorded_result(recorder, paths, pcp_sizes or [], stages)
        finally:
            coverage.stop()
            progress.close()
        with stop.shield():  # a Ctrl-C now would cost the report: ignored until it is written
            return _report(args, started, paths, None, None, result, out,
                           interrupted=stop.requested, coverage=coverage)


def _replay_sharded(args: argparse.Namespace, started: float, paths: list, pcp_sizes: Any,
                    stages: Any, total: int, out: Any, coverage: Any, workers: int) -> int:
    """``--workers N``: trace x PCP size x segment units on Ray workers, one report."""
    from simrig.distributed.replay_shards import replay_sharded
    from simrig.interrupt import StopRequests
    from simrig.progress import Progress
    from simrig.cli.flags import progress_mode

    progress = Progress(sys.stderr, mode=progress_mode(args), total=total)
    with StopRequests() as stop:
        try:
            sharded = replay_sharded(paths, workers=workers, address=args.ray,
                                     pcp_sizes=pcp_sizes, stages=stages,
                                     segment_steps=args.segment_steps, progress=progress,
                                     cudagraph_mode=args.cudagraph_mode,
                                     stop=lambda: stop.requested, coverage=coverage.enabled)
            for unit in sharded.units:
                coverage.add(unit.coverage)
        finally:
            coverage.stop()
            progress.close()
        with stop.shield():  # a Ctrl-C now would cost the report: ignored until it is written
            return _report(args, started, paths, workers, sharded, sharded.result, out,
                           interrupted=stop.requested, coverage=coverage)


def _report(args: argparse.Namespace, started: float, paths: list, workers: int | None,
            sharded: Any, result: Any, out: Any, interrupted: bool, coverage: Any = None) -> int:
    from simrig.coverage.session import without_coverage_data
    from simrig.errors import EXIT_INTERRUPTED
    from simrig.findings.classes import class_rows_for_print, verdict_counts, verdict_line
    from simrig.report.timing import time_share_line
    from simrig.report.writer import write_report
    from simrig.cli.flags import changes_line, emit_json, record_history, write_summary_md

    summary = {"command": "replay", "suite": "replay " + " ".join(map(_short_path, args.traces)),
               **result.summary()}
    summary["elapsed_s"] = round(time.perf_counter() - started, 3)
    summary["exit_status"] = result.exit_status
    if interrupted:  # the report holds every step replayed before the stop; the rest was not judged
        summary["stopped_by"] = "signal"
        summary["exit_status"] = EXIT_INTERRUPTED
    if workers is not None:  # per unit: where it ran and how long its replay took
        summary["workers"] = workers
        summary["units"] = [{"trace": u.unit.path, "pcp_size": u.unit.pcp_size, "start": u.unit.start,
                             "stop": u.unit.stop, "replay_s": round(u.seconds, 3), "worker": u.worker}
                            for u in sharded.units]
    headline = (("INTERRUPTED: " if interrupted else "")
                + f"replayed {summary['steps']:,} steps from {len(paths)} trace(s) "
                f"(pcp sizes {','.join(map(str, result.pcp_sizes))}) in {summary['elapsed_s']:.1f} s "
                f"({summary['steps_per_s']:.1f} steps/s), vLLM {result.vllm_version} on {result.device}")
    from simrig.coverage.session import coverage_line

    cov_tables, cov_summary = coverage.report_parts() if coverage is not None else ({}, {})
    summary.update(cov_summary)
    if coverage is not None:
        summary["exit_status"] = coverage.exit_status(summary["exit_status"], summary)
    from simrig.history.changes import since_previous

    summary["since_previous"] = since_previous(summary, result.classes)
    report = write_report(out, result.steps, result.findings, result.contract, summary,
                          classes=result.classes, headline=headline, extra_tables=cov_tables)
    summary["report"] = str(report)
    summary["classes"] = verdict_counts(result.classes)  # what write_report put in summary.json
    write_summary_md(args, "replay", summary, result.classes, headline, str(report / "report.html"))
    if not interrupted:  # a partial replay says nothing about the classes it did not reach
        record_history(summary, result.classes)
    if getattr(args, "json", False):
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
    print(f"report: {report / 'report.html'}")
    return summary["exit_status"]


def _check_graph_config(config, pcp_size: int, mode: str | None, path) -> None:
    """A --cudagraph-mode / --pcp-sizes combination the runner refuses is a usage error, up front;
    so is one whose runner would not fit the machine (the reader checked the trace's own config)."""
    from simrig.trace_io.bounds import check_config
    from simrig.trace_io.trace import TraceError

    flag = "--cudagraph-mode" if mode else "--pcp-sizes"
    try:
        replayed = config.replayed_as(pcp_size, mode)
        replayed.validate()
    except ValueError as exc:
        raise UsageError(f"{flag}: {path} at pcp size {pcp_size}: {exc}") from None
    if replayed != config:
        try:
            check_config(replayed, str(path))
        except TraceError as exc:
            raise UsageError(f"{flag}: {path} at pcp size {pcp_size}: {exc}") from None


def _short_path(path: str) -> str:
    """A trace argument relative to the working directory when inside it (the
    history's suite name should not depend on where the checkout lives)."""
    import os

    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else rel
