"""``simrig selftest``: seeded regressions of the installed vLLM, and whether simrig catches them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from simrig.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    from simrig.commands.common import add_output_flags

    p = sub.add_parser(
        "selftest", help="mutate the installed vLLM in a child process and check simrig catches it",
        description="For each mutant: replay the bundled traces, then fuzz until the first new "
                    "finding or the budget. Writes a scoreboard (CSV, parquet, HTML).",
        epilog="exit status: 0 every non-equivalent mutant detected and the baseline clean; "
               "1 a mutant survived, no longer applies, or the baseline is not clean; "
               "2 bad arguments")
    p.add_argument("--mutants", help="comma-separated mutant names (default: the whole catalogue)")
    p.add_argument("--budget-per-mutant", type=float, default=120.0, metavar="SECONDS",
                   help="time for replay + fuzz per mutant (default 120)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.add_argument("--list", action="store_true", help="print the catalogue and exit")
    p.add_argument("--skip-baseline", action="store_true",
                   help="do not run the unmutated code first (its signatures are then taken "
                        "from the known-findings baseline only)")
    add_output_flags(p, "selftest")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from simrig.report.writer import check_out_dir, default_out_dir, write_report
    from simrig.selftest.catalogue import BY_NAME, CATALOGUE
    from simrig.checks.known import installed_vllm_version
    from simrig.commands.common import emit_json, progress_mode, record_history
    from simrig.report.classes import class_rows_for_print, verdict_line
    from simrig.selftest.driver import (BASELINE, bundled_traces, run_child, scoreboard_classes,
                                        scoreboard_rows, select_mutants)

    if args.list:
        for m in CATALOGUE:
            tag = " (equivalent)" if m.equivalent else ""
            print(f"{m.name:28s} {m.module}.{m.qualname}{tag}\n{'':28s} {m.description}")
        return 0
    if args.budget_per_mutant <= 0:
        raise UsageError("--budget-per-mutant: must be > 0 seconds")
    names = select_mutants([n for n in (args.mutants or "").split(",") if n])
    out = check_out_dir(args.out or default_out_dir("selftest"))
    root = Path(__file__).resolve().parents[2]
    traces = bundled_traces(root)
    # A child also pays the vLLM import (~15 s) and its replay; give it room past the budget.
    timeout = args.budget_per_mutant + 180
    say = (lambda *a, **k: None) if progress_mode(args) == "quiet" else \
        (lambda *a, **k: print(*a, file=sys.stderr, **k))
    results = []
    baseline_sigs: list[list[str]] = []
    started = time.monotonic()
    if not args.skip_baseline:
        say(f"selftest: baseline (unmutated), budget {args.budget_per_mutant:.0f} s")
        base = run_child(BASELINE, budget_s=args.budget_per_mutant, seed=args.seed, baseline=[],
                         traces=traces, out_dir=out.parent / f".{out.name}-work", timeout_s=timeout)
        results.append(base)
        baseline_sigs = base.signatures
    for i, name in enumerate(names, 1):
        say(f"selftest: [{i}/{len(names)}] {name}", end="", flush=True)
        r = run_child(name, budget_s=args.budget_per_mutant, seed=args.seed, baseline=baseline_sigs,
                      traces=traces, out_dir=out.parent / f".{out.name}-work", timeout_s=timeout)
        results.append(r)
        verdict = ("detected in %.1f s via %s (%s)" % (r.seconds_to_detection, r.via, r.kind)
                   if r.detected else (r.error or ("equivalent" if BY_NAME[name].equivalent else "SURVIVED")))
        say(f" -> {verdict}")
    rows = scoreboard_rows(results)
    board = pd.DataFrame(rows)
    detected = board[board.status == "detected"]
    times = detected.seconds_to_detection.astype(float)
    failed = bool((board.status == "SURVIVED").sum() or (board.status == "error").sum()
                  or (not args.skip_baseline and rows[0]["status"] == "NOT CLEAN"))
    summary = {
        "command": "selftest", "suite": "selftest", "vllm_version": installed_vllm_version(),
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
        "elapsed_s": round(time.monotonic() - started, 1), "exit_status": int(failed),
    }
    empty = pd.DataFrame()
    classes = scoreboard_classes(rows)
    headline = (f"{summary['detected']}/{len(names)} mutants detected, {summary['survived']} survived, "
                f"{summary['errors']} errors, {summary['equivalent']} equivalent; baseline "
                f"{summary['baseline']}; budget {args.budget_per_mutant:.0f} s per mutant")
    write_report(out, empty, empty, empty, summary, extra_tables={"scoreboard": board},
                 title="simrig selftest scoreboard", classes=classes, occurrences=empty,
                 headline=headline)
    summary = json.loads((out / "summary.json").read_text())
    summary["report"] = str(out)
    record_history(summary, classes)
    if args.json:
        emit_json(summary)
        return int(failed)
    cols = ["mutant", "status", "via", "seconds_to_detection", "kind", "shrunk_steps"]
    print(board[cols].to_string(index=False))
    print(f"selftest: {headline}")
    print(verdict_line(summary["classes"]) + f" — exit {int(failed)}")
    for line in class_rows_for_print(classes):
        print(line)
    print(f"scoreboard: {out / 'report.html'}")
    return int(failed)
