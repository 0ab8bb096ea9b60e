"""``simrig selftest``: seeded regressions of the installed vLLM, and whether simrig catches them.

The only module outside ``simrig.selftest`` that imports it: the run and its
scoreboard are ``simrig.selftest.scoreboard``'s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from simrig.cli.flags import (add_memcheck_flag, add_output_flags, add_summary_md_flag, check_summary_md,
                              memcheck_env, progress_mode)
from simrig.coverage.session import CoverageRun, add_coverage_flags
from simrig.distributed.cluster import add_distributed_arguments, distributed_workers
from simrig.errors import UsageError

DESCRIPTION = """For each mutant: replay the bundled traces, then fuzz until the first new
    finding or the budget. Writes a scoreboard (CSV, parquet, HTML)."""
EPILOG = """exit status: 0 every non-equivalent mutant detected and the baseline clean;
    1 a mutant survived, no longer applies, the baseline is not clean, or the no-op
    control mutant was detected; 2 bad arguments; 130 interrupted by Ctrl-C (the
    scoreboard holds every mutant finished before it)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", description=DESCRIPTION, epilog=EPILOG,
                       help="mutate the installed vLLM in a child process and check simrig catches it")
    p.add_argument("--mutants", help="comma-separated mutant names (default: the whole catalogue)")
    p.add_argument("--budget-per-mutant", type=float, default=120.0, metavar="SECONDS",
                   help="time for replay + fuzz per mutant (default 120)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.add_argument("--list", action="store_true", help="print the catalogue and exit")
    p.add_argument("--skip-baseline", action="store_true",
                   help="do not run the unmutated code first: its classes are taken from the "
                        "last baseline run (.cache/selftest/), and known findings, loud "
                        "rejections and rig errors never count as detections")
    p.add_argument("--fuzz-only", action="store_true",
                   help="score the fuzz campaign alone: no bundled traces, for the baseline "
                        "and every mutant")
    add_output_flags(p, "selftest")
    add_summary_md_flag(p)
    add_memcheck_flag(p)  # a mutant that makes a kernel read or write out of bounds is detected by it
    add_coverage_flags(p, default=False)
    p.add_argument("--steer", action="store_true",
                   help="steer each mutant's fuzz phase by coverage (hypothesis.target() on the MRV2 "
                        "arcs an example reaches; no corpus), to compare time to detection")
    add_distributed_arguments(p, "run the mutants (each in its own child process) on N Ray workers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The self-test; its children run under the kernel memory checker unless --no-memcheck
    (they inherit SIMRIG_MEMCHECK)."""
    with memcheck_env(args.memcheck):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # cold path: the catalogue and the scoreboard bring pandas, off `simrig --help`
    from simrig.report.writer import check_out_dir, default_out_dir
    from simrig.selftest import mutant_runs, scoreboard  # cold path: pandas

    if args.list:
        for m in mutant_runs.CATALOGUE:
            tag = " (equivalent)" if m.equivalent else " (control)" if m.control else ""
            print(f"{m.name:28s} {m.module}.{m.qualname}{tag}\n{'':28s} {m.description}")
        return 0
    started = time.monotonic()
    if args.budget_per_mutant <= 0:
        raise UsageError("--budget-per-mutant: must be > 0 seconds")
    names = mutant_runs.select_mutants([n for n in (args.mutants or "").split(",") if n])
    out = check_out_dir(args.out or default_out_dir("selftest"))
    check_summary_md(args)
    coverage = CoverageRun.begin(args)  # a malformed reasons file: one line, exit 2, before any child
    if args.steer:
        os.environ["SIMRIG_STEER"] = "1"  # the children's fuzz phases read it
    workers = distributed_workers(args)
    say = (lambda *a, **k: None) if progress_mode(args) == "quiet" else \
        (lambda *a, **k: print(*a, file=sys.stderr, **k))
    return scoreboard.run_selftest(scoreboard.SelftestRun(
        names=names, budget_s=args.budget_per_mutant, seed=args.seed, skip_baseline=args.skip_baseline,
        fuzz_only=args.fuzz_only, steer=args.steer, coverage=coverage, workers=workers, ray=args.ray,
        out=out, summary_md=args.summary_md, json=args.json, say=say, started=started))
