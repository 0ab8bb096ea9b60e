"""``simrig selftest``: seeded regressions of the installed vLLM, and whether simrig catches them."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from simrig.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "selftest", help="mutate the installed vLLM in a child process and check simrig catches it",
        description="For each mutant: replay the bundled traces, then fuzz until the first new "
                    "finding or the budget. Writes a scoreboard (CSV, parquet, HTML). Exit 1 if any "
                    "non-equivalent mutant survives or the unmutated code is not clean.")
    p.add_argument("--mutants", help="comma-separated mutant names (default: the whole catalogue)")
    p.add_argument("--budget-per-mutant", type=float, default=120.0, metavar="SECONDS",
                   help="time for replay + fuzz per mutant (default 120)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.add_argument("--out", help="scoreboard directory (default reports/selftest-<UTC time>)")
    p.add_argument("--list", action="store_true", help="print the catalogue and exit")
    p.add_argument("--skip-baseline", action="store_true",
                   help="do not run the unmutated code first (its signatures are then taken "
                        "from the known-findings baseline only)")
    from simrig.distributed.cluster import add_distributed_arguments

    add_distributed_arguments(p, "run the mutants (each in its own child process) on N Ray workers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from simrig.report.writer import check_out_dir, default_out_dir, write_report
    from simrig.selftest.catalogue import BY_NAME, CATALOGUE
    from simrig.selftest.driver import BASELINE, bundled_traces, run_child, scoreboard_rows, select_mutants

    if args.list:
        for m in CATALOGUE:
            tag = " (equivalent)" if m.equivalent else ""
            print(f"{m.name:28s} {m.module}.{m.qualname}{tag}\n{'':28s} {m.description}")
        return 0
    if args.budget_per_mutant <= 0:
        raise UsageError("--budget-per-mutant: must be > 0 seconds")
    names = select_mutants([n for n in (args.mutants or "").split(",") if n])
    out = check_out_dir(args.out or default_out_dir("selftest"))
    from simrig.distributed.cluster import distributed_workers

    workers = distributed_workers(args)
    root = Path(__file__).resolve().parents[2]
    traces = bundled_traces(root)
    # A child also pays the vLLM import (~15 s) and its replay; give it room past the budget.
    timeout = args.budget_per_mutant + 180
    results = []
    baseline_sigs: list[list[str]] = []
    started = time.monotonic()
    if not args.skip_baseline:
        print(f"selftest: baseline (unmutated), budget {args.budget_per_mutant:.0f} s", file=sys.stderr)
        base = run_child(BASELINE, budget_s=args.budget_per_mutant, seed=args.seed, baseline=[],
                         traces=traces, out_dir=out.parent / f".{out.name}-work", timeout_s=timeout)
        results.append(base)
        baseline_sigs = base.signatures

    def verdict(name: str, r: Any) -> str:
        return ("detected in %.1f s via %s (%s)" % (r.seconds_to_detection, r.via, r.kind)
                if r.detected else (r.error or ("equivalent" if BY_NAME[name].equivalent else "SURVIVED")))

    if workers is not None:  # one Ray task per mutant; results in catalogue order
        from simrig.distributed.cluster import ray_session
        from simrig.distributed.tasks import map_in_order

        calls = [dict(mutant=name, budget_s=args.budget_per_mutant, seed=args.seed,
                      baseline=baseline_sigs, traces=traces, out_dir=out.parent / f".{out.name}-work",
                      timeout_s=timeout) for name in names]
        with ray_session(workers, args.ray) as ray:
            results += map_in_order(ray, run_child, calls, on_done=lambda i, r: print(
                f"selftest: {names[i]} -> {verdict(names[i], r)}", file=sys.stderr, flush=True))
    for i, name in enumerate(names if workers is None else [], 1):
        print(f"selftest: [{i}/{len(names)}] {name}", file=sys.stderr, end="", flush=True)
        r = run_child(name, budget_s=args.budget_per_mutant, seed=args.seed, baseline=baseline_sigs,
                      traces=traces, out_dir=out.parent / f".{out.name}-work", timeout_s=timeout)
        results.append(r)
        print(f" -> {verdict(name, r)}", file=sys.stderr)
    rows = scoreboard_rows(results)
    board = pd.DataFrame(rows)
    detected = board[board.status == "detected"]
    times = detected.seconds_to_detection.astype(float)
    summary = {
        "mutants": len(names), "detected": int(len(detected)),
        "survived": int((board.status == "SURVIVED").sum()),
        "errors": int((board.status == "error").sum()),
        "equivalent": int((board.status == "equivalent").sum()),
        "baseline": "skipped" if args.skip_baseline else rows[0]["status"],
        "median_seconds_to_detection": float(times.median()) if len(times) else None,
        "worst_seconds_to_detection": float(times.max()) if len(times) else None,
        "median_shrunk_steps": float(detected.shrunk_steps.median()) if len(detected) else None,
        "worst_shrunk_steps": float(detected.shrunk_steps.max()) if len(detected) else None,
        "budget_per_mutant_s": args.budget_per_mutant, "seed": args.seed,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    if workers is not None:
        summary["workers"] = workers
    empty = pd.DataFrame()
    write_report(out, empty, empty, empty, summary, extra_tables={"scoreboard": board},
                 title="simrig selftest scoreboard")
    cols = ["mutant", "status", "via", "seconds_to_detection", "kind", "shrunk_steps"]
    print(board[cols].to_string(index=False))
    print(f"selftest: {summary['detected']}/{len(names)} detected, {summary['survived']} survived, "
          f"{summary['errors']} errors; scoreboard in {out}")
    failed = summary["survived"] or summary["errors"] or summary["baseline"] == "NOT CLEAN"
    return 1 if failed else 0
