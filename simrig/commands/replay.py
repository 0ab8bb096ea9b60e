"""``simrig replay TRACE...``: replay traces through the real MRV2 input path.

Every trace is validated in full (header and every step line) before vLLM is
imported, so a bad file anywhere fails in seconds with one line and exit 2,
and no report directory is written.
"""

from __future__ import annotations

import argparse
import sys
import time

from simrig.errors import UsageError

SHOWN_FINDINGS = 5


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay", help="replay traces through vLLM's real runner input path and report findings",
        description="Replay scheduler-output traces (files, or directories of *.jsonl[.gz|.zst]) "
                    "through the installed vLLM's Model Runner V2 input path, check every step "
                    "and write a report. Exit 0: no new findings (known findings do not fail); "
                    "1: new findings; 2: bad arguments or a malformed trace.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace file or directory")
    p.add_argument("--out", metavar="DIR",
                   help="report directory (default: reports/replay-<UTC timestamp>)")
    p.add_argument("--pcp-sizes", metavar="N,N,...",
                   help="replay each trace once per PCP world size (default: the trace's own)")
    p.add_argument("--stages", metavar="S,S,...",
                   help="optional stages to run: gather,prepare,partition,dummy (default: all; "
                        "lifecycle always runs)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    from simrig.distributed.cluster import add_distributed_arguments

    add_distributed_arguments(p, "replay trace x PCP size x segment units on N Ray workers")
    p.add_argument("--segment-steps", type=int, default=None, metavar="N",
                   help="with --workers: cut traces longer than N steps into segments, each "
                        "starting with a resync step (default: max(200, total steps / N))")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simrig.progress import PLAIN, QUIET, TTY, Progress
    from simrig.replay import expand_trace_paths, parse_pcp_sizes, parse_stages, replay_traces, scan_trace
    from simrig.report.writer import check_out_dir, default_out_dir, write_report

    started = time.perf_counter()
    pcp_sizes = parse_pcp_sizes(args.pcp_sizes)
    stages = parse_stages(args.stages)
    out = check_out_dir(args.out) if args.out else default_out_dir("replay")
    paths = expand_trace_paths(args.traces)
    from simrig.distributed.cluster import distributed_workers

    workers = distributed_workers(args)
    if args.segment_steps is not None and args.segment_steps < 1:
        raise UsageError(f"--segment-steps: must be >= 1, got {args.segment_steps}")
    total = 0
    for path in paths:  # every header and step line, before anything runs
        header, num_steps = scan_trace(path)
        total += num_steps * len(pcp_sizes or [header.config.pcp_size])

    mode = QUIET if args.quiet else (TTY if sys.stderr.isatty() else PLAIN)
    progress = Progress(sys.stderr, mode=mode, total=total)
    try:
        if workers is not None:
            from simrig.distributed.replay_shards import replay_sharded

            sharded = replay_sharded(paths, workers=workers, address=args.ray, pcp_sizes=pcp_sizes,
                                     stages=stages, segment_steps=args.segment_steps,
                                     progress=progress)
            result = sharded.result
        else:
            result = replay_traces(paths, pcp_sizes=pcp_sizes, stages=stages, progress=progress)
    finally:
        progress.close()
    summary = result.summary()
    summary["elapsed_s"] = round(time.perf_counter() - started, 3)
    summary["exit_status"] = 1 if result.num_new else 0
    if workers is not None:  # per unit: where it ran and how long its replay took
        summary["workers"] = workers
        summary["units"] = [{"trace": u.unit.path, "pcp_size": u.unit.pcp_size, "start": u.unit.start,
                             "stop": u.unit.stop, "replay_s": round(u.seconds, 3), "worker": u.worker}
                            for u in sharded.units]
    report = write_report(out, result.steps, result.findings, result.contract, summary)

    kinds = ", ".join(f"{k} {v}" for k, v in summary["findings_by_kind"].items()) or "none"
    print(f"replayed {summary['steps']:,} steps from {len(paths)} trace(s) "
          f"(pcp sizes {','.join(map(str, result.pcp_sizes))}) in {summary['elapsed_s']:.1f} s "
          f"({summary['steps_per_s']:.1f} steps/s), vLLM {result.vllm_version} on {result.device}")
    print(f"findings: {summary['findings']} ({summary['new']} new, {summary['known']} known): {kinds}")
    for finding in result.first_findings[:SHOWN_FINDINGS]:
        mark = "known" if finding.known else "NEW"
        where = f"{finding.trace}: " if finding.trace else ""
        print(f"  [{mark}] {where}{finding.one_line()}")
    listed = summary["findings"] - summary.get("known_not_listed", 0)
    if listed > SHOWN_FINDINGS:
        print(f"  ... {listed - SHOWN_FINDINGS} more in {report / 'findings.csv'}")
    if summary.get("known_not_listed"):
        print(f"  ({summary['known_not_listed']:,} repeats of known findings counted, not listed)")
    print(f"report: {report / 'report.html'}")
    return summary["exit_status"]
