"""``simrig fuzz``: a Hypothesis campaign against the real runner, in a supervised worker
process (``simrig.supervision.campaign_worker``: a crash or hang is a finding, the campaign goes on)
or sharded on Ray workers (``--workers``); both end in ``simrig.campaign.campaign_report.finish``:
the same report, summary keys, history row and exit status."""

from __future__ import annotations

import argparse
from pathlib import Path

from simrig.cli.flags import add_run_flags, check_step_timeout, check_summary_md, memcheck_env, progress_mode
from simrig.coverage.session import CoverageRun
from simrig.distributed.cluster import add_distributed_arguments, distributed_workers
from simrig.errors import UsageError
from simrig.step import CUDAGRAPH_MODES
from simrig.trace_io.trace import trace_files_in

DEFAULT_BUDGET_S = 60.0  # when neither --budget nor --max-examples is given
DESCRIPTION = """Replay traces/regressions/, then run the stateful scheduler machine
    through the real MRV2 input path until the budget is spent. Each new finding class is
    shrunk to a minimal v1 trace under OUT/shrunk/ (a crash class by at most 32 replays of
    smaller schedules in forked children, about a second each, before the report). Loud
    rejections of adversarial violations are *expected*; known findings of this vLLM are
    *known*; anything else is *new*."""
EPILOG = """exit status: 0 no new finding class; 1 a new finding class; 2 bad arguments
    or input; 3 simrig's own code raised (rig_error, traceback in the report)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fuzz", description=DESCRIPTION, epilog=EPILOG,
                       help="fuzz the runner with the stateful scheduler-contract machine")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="wall-clock budget for exploring (default 60, none with --max-examples); "
                        "shrinking a late find may take up to a quarter more. A run the budget "
                        "stops is not repeatable (the report says so)")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    p.add_argument("--mode", choices=("valid", "adversarial"), default="valid",
                   help="valid: never break the contract; adversarial: also send unknown, "
                        "finished and duplicate ids (default valid)")
    p.add_argument("--pcp-sizes", default="1,2", metavar="LIST",
                   help="PCP world sizes to draw configs from, e.g. 1,2,4,8 (default 1,2)")
    p.add_argument("--cudagraph-modes", default=",".join(CUDAGRAPH_MODES), metavar="LIST",
                   help="vLLM cudagraph modes to draw configs from; each step is dispatched and "
                        "padded by vLLM's own CudaGraphManager (default all: "
                        + ",".join(CUDAGRAPH_MODES) + ")")
    p.add_argument("--database", default=".cache/hypothesis", metavar="DIR",
                   help="Hypothesis example database, reused by later campaigns "
                        "(default .cache/hypothesis; 'none' disables it)")
    p.add_argument("--max-examples", type=int, default=None, metavar="N",
                   help="stop after N examples (per shard with --workers); without --budget the "
                        "clock never stops the run, so --seed S --database none repeats it exactly")
    p.add_argument("--stages", default=None, metavar="LIST",
                   help="optional stages to run: gather,prepare,partition,dummy (default all)")
    p.add_argument("--violations", default=None, metavar="LIST",
                   help="adversarial violations: unknown_id,finished_id,unknown_cached,"
                        "duplicate_new (default all)")
    p.add_argument("--steps-per-example", type=int, default=20, metavar="N",
                   help="rules per machine example (default 20)")
    p.add_argument("--regressions", default="traces/regressions", metavar="DIR",
                   help="regression traces replayed first (default traces/regressions)")
    p.add_argument("--no-regressions", action="store_true", help="skip the regression replay")
    p.add_argument("--save-regressions", action="store_true",
                   help="also copy each failing shrunk trace into the regressions folder")
    add_run_flags(p, "fuzz")
    p.add_argument("--steer", action=argparse.BooleanOptionalAction, default=False,
                   help="steer the campaign by coverage (implies --coverage): Hypothesis' target() "
                        "on the MRV2 arcs each example reaches, and examples that reach new arcs "
                        "kept in --corpus and replayed first by the next steered campaign "
                        "(off by default: it measured no gain; see docs/coverage.md)")
    p.add_argument("--corpus", default=".cache/coverage-corpus", metavar="DIR",
                   help="where --steer keeps examples that reached new arcs ('none': keep none)")
    p.add_argument("--profile", action="store_true",
                   help="sample the campaign's stack every 5 ms and write OUT/profile/: the time split "
                        "between vLLM's calls, Hypothesis and the rig, the top functions of each, and "
                        "collapsed stacks for a flame graph (costs well under 1%%)")
    add_distributed_arguments(p, "shard the campaign (seed x mode x PCP slice) over N Ray workers")
    p.set_defaults(func=run)


def _mode_list(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip().upper() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in CUDAGRAPH_MODES]
    if bad or not modes:
        raise UsageError(f"--cudagraph-modes: unknown {bad or text!r}; choose from {', '.join(CUDAGRAPH_MODES)}")
    return modes


def _int_list(text: str, name: str, allowed: tuple[int, ...] | None = None) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{name}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{name}: expected positive integers, got {text!r}")
    if allowed is not None and any(v not in allowed for v in values):
        raise UsageError(f"{name}: each must be one of {allowed}, got {text!r}")
    return values


def options_from_args(args: argparse.Namespace):
    # cold path: the campaign, the replay and the machine bring Hypothesis, pandas and vLLM's
    # adapters, off `simrig --help`
    from simrig.campaign.fuzz import CampaignOptions
    from simrig.replay import parse_stages, scan_trace  # cold path (see above)
    from simrig.report.writer import check_out_dir, default_out_dir  # cold path (see above)
    from strategies.machine import VIOLATIONS  # cold path (see above)

    if args.budget is not None and args.budget <= 0:
        raise UsageError(f"--budget: must be > 0 seconds, got {args.budget}")
    if args.max_examples is not None and args.max_examples < 1:
        raise UsageError(f"--max-examples: must be >= 1, got {args.max_examples}")
    check_step_timeout(args)
    check_summary_md(args)
    if args.steps_per_example < 1:
        raise UsageError(f"--steps-per-example: must be >= 1, got {args.steps_per_example}")
    violations = None
    if args.violations is not None:
        violations = tuple(v.strip() for v in args.violations.split(",") if v.strip())
        bad = [v for v in violations if v not in VIOLATIONS]
        if bad or not violations:
            raise UsageError(f"--violations: unknown {bad or args.violations!r}; "
                             f"choose from {', '.join(VIOLATIONS)}")
    out = Path(args.out) if args.out else default_out_dir("fuzz")
    check_out_dir(out)  # refuse a bad --out before spending the budget
    regressions = Path(args.regressions)
    if not args.no_regressions and regressions.exists():
        if not regressions.is_dir():
            raise UsageError(f"--regressions: {regressions} is not a directory")
        for path in trace_files_in(regressions):  # a bad line: one line, exit 2, before vLLM
            scan_trace(path)
    steer = bool(args.steer)
    if steer:
        args.coverage = True
        if str(args.corpus).lower() != "none" and Path(args.corpus).exists() and not Path(args.corpus).is_dir():
            raise UsageError(f"--corpus: {args.corpus} is not a directory")
    budget = args.budget if args.budget is not None else (
        None if args.max_examples is not None else DEFAULT_BUDGET_S)
    return CampaignOptions(
        budget_s=budget, seed=args.seed, mode=args.mode,
        pcp_sizes=_int_list(args.pcp_sizes, "--pcp-sizes", (1, 2, 4, 8)), out_dir=out,
        cudagraph_modes=_mode_list(args.cudagraph_modes),
        database=None if args.database.lower() == "none" else Path(args.database),
        max_examples=args.max_examples, save_regressions=args.save_regressions,
        regressions_dir=regressions, replay_regressions=not args.no_regressions,
        stages=parse_stages(args.stages), violations=violations,
        steps_per_example=args.steps_per_example, progress=progress_mode(args),
        coverage=steer or CoverageRun.begin(args).enabled,  # a malformed reasons file: exit 2 here
        fail_on_unexplained_coverage=args.fail_on_unexplained_coverage, steer=steer,
        unreached=Path(args.unreached) if args.unreached else None,
        corpus_dir=None if str(args.corpus).lower() == "none" else Path(args.corpus),
        profile=bool(getattr(args, "profile", False)))


def run(args: argparse.Namespace) -> int:
    with memcheck_env(args.memcheck):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # cold path: the campaign brings Hypothesis, pandas and vLLM's adapters, off `simrig --help`
    from simrig.campaign.fuzz import Campaign
    from simrig.campaign.campaign_report import finish  # cold path (see above)

    options = options_from_args(args)
    if options.profile and (args.workers is not None or args.ray is not None):
        raise UsageError("--profile: samples this process's campaign; run it without --workers/--ray")
    workers = distributed_workers(args)  # Ray missing / unreachable: exit 2 before anything runs

    def end(campaign, status, shard_rows=()):
        return finish(campaign, status, options.out_dir, summary_md=args.summary_md, json_out=args.json,
                      shard_rows=shard_rows)

    if workers is not None:
        from simrig.distributed.fuzz_shards import ShardedCampaign  # cold path: Ray, an optional extra

        sharded = ShardedCampaign(options, workers, args.ray)
        status = sharded.run()
        return end(sharded.merged, status, sharded.rows)
    from simrig.supervision import forked  # cold path (see above)

    if not forked.enabled():  # SIMRIG_SUPERVISE=0: in this process (a debugger, a profiler)
        campaign = Campaign(options)
        return end(campaign, campaign.run())
    from simrig.supervision.campaign_worker import run_supervised  # cold path (see above)

    # the campaign runs in a forked worker: a crash or hang in vLLM ends one example, not the run
    return run_supervised(options, end, step_timeout_s=args.step_timeout)
