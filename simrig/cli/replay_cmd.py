"""``simrig replay TRACE...``: replay traces through the real MRV2 input path.

Every trace is validated in full (header and every step line) before vLLM is
imported, so a bad file anywhere fails in seconds with one line and exit 2,
and no report directory is written. The run is ``simrig.replay_run``'s.
"""

from __future__ import annotations

import argparse
import time

from simrig.cli.flags import (add_run_flags, check_step_timeout, check_summary_md, memcheck_env,
                              progress_mode)
from simrig.coverage.session import CoverageRun
from simrig.distributed.cluster import add_distributed_arguments, distributed_workers
from simrig.errors import UsageError
from simrig.trace_io.bounds import check_config
from simrig.trace_io.trace import TraceError

DESCRIPTION = """Replay scheduler-output traces (files, or directories of *.jsonl[.gz|.zst])
    through the installed vLLM's Model Runner V2 input path, check every step and write a
    report: one row per finding class, verdict new / known / expected (a class a trace
    header's `expect` declares)."""
EPILOG = """exit status: 0 no new finding class (known and expected classes do not fail);
    1 a new finding class, or an expected class that did not occur; 2 bad arguments or a
    malformed trace (one line on stderr, no report); 3 simrig's own code raised (rig_error
    findings, tracebacks in the report); 130 interrupted by Ctrl-C (the report holds every
    step replayed before it)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", description=DESCRIPTION, epilog=EPILOG,
                       help="replay traces through vLLM's real runner input path and report findings",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace file or directory")
    p.add_argument("--pcp-sizes", metavar="N,N,...",
                   help="replay each trace once per PCP world size (default: the trace's own)")
    p.add_argument("--cudagraph-mode", metavar="MODE", type=str.upper,
                   help="""replay every trace under this vLLM cudagraph mode (NONE, PIECEWISE, FULL,
                        FULL_DECODE_ONLY, FULL_AND_PIECEWISE), dispatched and padded by vLLM's own
                        CudaGraphManager (default: the trace's own mode)""")
    p.add_argument("--stages", metavar="S,S,...",
                   help="optional stages to run: gather,prepare,partition,dummy (default: all; "
                        "lifecycle always runs)")
    add_run_flags(p, "replay")
    add_distributed_arguments(p, "replay trace x PCP size x segment units on N Ray workers")
    p.add_argument("--segment-steps", type=int, default=None, metavar="N",
                   help="with --workers: cut traces longer than N steps into segments, each "
                        "starting with a resync step (default: max(200, total steps / N))")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with memcheck_env(args.memcheck):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # cold path: the replay brings pandas and vLLM's adapters, off `simrig --help`
    from simrig import replay, replay_run
    from simrig.report.writer import check_out_dir, default_out_dir  # cold path: pandas

    started = time.perf_counter()
    pcp_sizes = replay.parse_pcp_sizes(args.pcp_sizes)
    stages = replay.parse_stages(args.stages)
    out = check_out_dir(args.out if args.out else default_out_dir("replay"))
    paths = replay.expand_trace_paths(args.traces)
    workers = distributed_workers(args)
    check_step_timeout(args)
    check_summary_md(args)
    if args.segment_steps is not None and args.segment_steps < 1:
        raise UsageError(f"--segment-steps: must be >= 1, got {args.segment_steps}")
    total = 0
    for path in paths:  # every header and step line, before anything runs
        header, num_steps = replay.scan_trace(path)
        total += num_steps * len(pcp_sizes or [header.config.pcp_size])
        for size in pcp_sizes or [header.config.pcp_size]:
            _check_graph_config(header.config, size, args.cudagraph_mode, path)
    coverage = CoverageRun.begin(args)  # a malformed reasons file: exit 2 before anything runs
    r = replay_run.ReplayRun(traces=args.traces, paths=paths, pcp_sizes=pcp_sizes, stages=stages,
                             cudagraph_mode=args.cudagraph_mode, total=total, out=out, coverage=coverage,
                             progress=progress_mode(args), summary_md=args.summary_md,
                             json=args.json, started=started)
    return replay_run.run(r, workers=workers, ray=args.ray, segment_steps=args.segment_steps,
                          step_timeout=args.step_timeout)


def _check_graph_config(config, pcp_size: int, mode: str | None, path) -> None:
    """A --cudagraph-mode / --pcp-sizes combination the runner refuses is a usage error, up front;
    so is one whose runner would not fit the machine (the reader checked the trace's own config)."""
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
