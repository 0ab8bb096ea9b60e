"""``simrig selftest``: seeded regressions of the installed vLLM, and whether simrig catches them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from simrig.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    from simrig.cli.flags import add_output_flags, add_summary_md_flag

    p = sub.add_parser(
        "selftest", help="mutate the installed vLLM in a child process and check simrig catches it",
        description="For each mutant: replay the bundled traces, then fuzz until the first new "
                    "finding or the budget. Writes a scoreboard (CSV, parquet, HTML).",
        epilog="exit status: 0 every non-equivalent mutant detected and the baseline clean; "
               "1 a mutant survived, no longer applies, the baseline is not clean, or the no-op "
               "control mutant was detected; "
               "2 bad arguments; 130 interrupted by Ctrl-C (the scoreboard holds every "
               "mutant finished before it)")
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
    p.add_argument("--no-memcheck", action="store_true",
                   help="run the children without the kernel memory checker (on by default here: "
                        "a mutant that makes a kernel read or write out of bounds is detected by it)")
    from simrig.coverage.session import add_coverage_flags

    add_coverage_flags(p, default=False)
    p.add_argument("--steer", action="store_true",
                   help="steer each mutant's fuzz phase by coverage (hypothesis.target() on the MRV2 "
                        "arcs an example reaches; no corpus), to compare time to detection")
    from simrig.distributed.cluster import add_distributed_arguments

    add_distributed_arguments(p, "run the mutants (each in its own child process) on N Ray workers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The self-test; its children run under the kernel memory checker unless --no-memcheck
    (they inherit SIMRIG_MEMCHECK)."""
    from simrig.cli.flags import memcheck_env

    with memcheck_env(not args.no_memcheck):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from simrig.interrupt import StopRequests
    from simrig.report.writer import check_out_dir, default_out_dir
    from simrig.selftest.catalogue import CATALOGUE
    from simrig.selftest.driver import bundled_traces, select_mutants
    from simrig.cli.flags import progress_mode

    if args.list:
        for m in CATALOGUE:
            tag = " (equivalent)" if m.equivalent else " (control)" if m.control else ""
            print(f"{m.name:28s} {m.module}.{m.qualname}{tag}\n{'':28s} {m.description}")
        return 0
    started = time.monotonic()
    if args.budget_per_mutant <= 0:
        raise UsageError("--budget-per-mutant: must be > 0 seconds")
    names = select_mutants([n for n in (args.mutants or "").split(",") if n])
    out = check_out_dir(args.out or default_out_dir("selftest"))
    from simrig.cli.flags import check_summary_md

    check_summary_md(args)
    from simrig.coverage.session import CoverageRun

    CoverageRun.begin(args)  # a malformed reasons file: one line, exit 2, before any child
    if args.steer:
        os.environ["SIMRIG_STEER"] = "1"  # the children's fuzz phases read it
    from simrig.distributed.cluster import distributed_workers

    workers = distributed_workers(args)
    traces = [] if args.fuzz_only else bundled_traces(Path(__file__).resolve().parents[2])
    # A child also pays the vLLM import (~15 s) and its replay; give it room past the budget.
    timeout = args.budget_per_mutant + 180
    say = (lambda *a, **k: None) if progress_mode(args) == "quiet" else \
        (lambda *a, **k: print(*a, file=sys.stderr, **k))
    results: list[Any] = []
    with StopRequests(note="stopping after the mutant in flight; the scoreboard keeps every "
                           "mutant finished (again to abandon it)") as stop:
        try:
            _run_mutants(args, names, traces, out, timeout, workers, say, results, stop)
        except KeyboardInterrupt:  # a second Ctrl-C: the mutant in flight is dropped
            pass
        with stop.shield():  # a Ctrl-C now would cost the scoreboard: ignored until written
            return _scoreboard(args, names, results, out, workers, started,
                               interrupted=stop.requested)


def _run_mutants(args: argparse.Namespace, names: list[str], traces: list[Path], out: Path,
                 timeout: float, workers: int | None, say: Any, results: list[Any],
                 stop: Any) -> None:
    """The baseline, then each mutant, appended to ``results`` as each finishes."""
    from simrig.selftest.driver import BASELINE, baseline_cache, run_child

    root = Path(__file__).resolve().parents[2]
    baseline_sigs: list[list[str]] = []
    work = out.parent / f".{out.name}-work"
    if not args.skip_baseline:
        say(f"selftest: baseline (unmutated), budget {args.budget_per_mutant:.0f} s")
        base = run_child(BASELINE, budget_s=args.budget_per_mutant, seed=args.seed, baseline=[],
                         traces=traces, out_dir=work, timeout_s=timeout,
                         coverage=getattr(args, "coverage", False))
        results.append(base)
        baseline_sigs = base.signatures
        if stop.requested:
            return
        cache = baseline_cache(root)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"signatures": baseline_sigs, "fuzz_only": args.fuzz_only,
                                     "budget_s": args.budget_per_mutant, "seed": args.seed}))
    elif baseline_cache(root).is_file():
        try:
            baseline_sigs = json.loads(baseline_cache(root).read_text())["signatures"]
        except (ValueError, KeyError) as exc:
            raise UsageError(f"{baseline_cache(root)}: unreadable baseline ({exc}); "
                             "run without --skip-baseline once") from None

    if workers is not None:  # one Ray task per mutant; results in catalogue order
        from simrig.distributed.cluster import ray_session
        from simrig.distributed.tasks import map_in_order

        calls = [dict(mutant=name, budget_s=args.budget_per_mutant, seed=args.seed,
                      baseline=baseline_sigs, traces=traces, out_dir=work,
                      timeout_s=timeout) for name in names]
        with ray_session(workers, args.ray) as ray:
            results += map_in_order(ray, run_child, calls, on_done=lambda i, r: say(
                f"selftest: {names[i]} -> {verdict(names[i], r)}", flush=True))
        return
    for i, name in enumerate(names, 1):
        if stop.requested:
            return
        say(f"selftest: [{i}/{len(names)}] {name}", end="", flush=True)
        r = run_child(name, budget_s=args.budget_per_mutant, seed=args.seed, baseline=baseline_sigs,
                      traces=traces, out_dir=work, timeout_s=timeout)
        results.append(r)
        say(f" -> {verdict(name, r)}")


def verdict(name: str, r: Any) -> str:
    from simrig.selftest.catalogue import BY_NAME

    m = BY_NAME[name]
    text = ("detected in %.1f s by %s via %s (%s)" % (r.seconds_to_detection, r.phase, r.via, r.kind)
            if r.detected else (r.error or ("equivalent" if m.equivalent else
                                            "control survived" if m.control else "SURVIVED")))
    return ("CONTROL DETECTED (the scoring is broken): " + text) if m.control and r.detected else text


def _scoreboard(args: argparse.Namespace, names: list[str], results: list[Any], out: Path,
                workers: int | None, started: float, interrupted: bool) -> int:
    import pandas as pd

    from simrig.errors import EXIT_INTERRUPTED
    from simrig.findings.classes import class_rows_for_print, verdict_line
    from simrig.findings.known import installed_vllm_version
    from simrig.report.writer import write_report
    from simrig.selftest.driver import scoreboard_classes, scoreboard_rows
    from simrig.cli.flags import changes_line, emit_json, record_history, write_summary_md

    if not results:  # stopped before the first child finished: nothing to score
        print("simrig selftest: interrupted before the first run finished; no scoreboard written",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    rows = scoreboard_rows(results)
    board = pd.DataFrame(rows)
    detected = board[board.status == "detected"]
    times = detected.seconds_to_detection.astype(float)
    scored = board[(board.status != "clean") & (board.status != "NOT CLEAN") & ~board.control
                   & ~board.equivalent]
    failed = bool((board.status == "SURVIVED").sum() or (board.status == "error").sum()
                  or (board.status == "CONTROL DETECTED").sum()
                  or (not args.skip_baseline and rows[0]["status"] == "NOT CLEAN"))
    summary = {
        "command": "selftest", "suite": "selftest", "vllm_version": installed_vllm_version(),
        "mutants": len(names), "detected": int(len(detected)),
        "scored_mutants": int(len(scored)),
        "detection_rate": round(len(detected) / len(scored), 3) if len(scored) else None,
        "detected_by_phase": {str(k): int(v) for k, v in detected.phase.value_counts().items()},
        "control": ("skipped" if not board.control.any() else
                    "CONTROL DETECTED" if (board.status == "CONTROL DETECTED").any() else "survived"),
        "fuzz_only": bool(args.fuzz_only),
        "survived": int((board.status == "SURVIVED").sum()),
        "errors": int((board.status == "error").sum()),
        "equivalent": int((board.status == "equivalent").sum()),
        "baseline": "skipped" if args.skip_baseline else rows[0]["status"],
        "median_seconds_to_detection": float(times.median()) if len(times) else None,
        "worst_seconds_to_detection": float(times.max()) if len(times) else None,
        "median_shrunk_steps": float(detected.shrunk_steps.median()) if len(detected) else None,
        "worst_shrunk_steps": float(detected.shrunk_steps.max()) if len(detected) else None,
        "budget_per_mutant_s": args.budget_per_mutant, "seed": args.seed, "steer": bool(args.steer),
        "elapsed_s": round(time.monotonic() - started, 1), "exit_status": int(failed),
    }
    if interrupted:  # the scoreboard holds the mutants finished before Ctrl-C
        summary.update(stopped_by="signal", exit_status=EXIT_INTERRUPTED,
                       not_run=[n for n in names[len(results) - (not args.skip_baseline):]])
    if workers is not None:
        summary["workers"] = workers
    from simrig.coverage.collect import from_jsonable
    from simrig.coverage.session import CoverageRun, coverage_line, without_coverage_data

    coverage = CoverageRun.begin(args)  # read once already, before the children: cannot fail now
    coverage.enabled = coverage.enabled and not args.skip_baseline
    for r in results:  # the baseline's (the unmutated release): mutants are never measured
        if r.mutant == "baseline" and r.coverage:
            coverage.add(from_jsonable(r.coverage))
    cov_tables, cov_summary = coverage.report_parts()
    summary.update(cov_summary)
    summary["exit_status"] = coverage.exit_status(summary["exit_status"], summary)
    empty = pd.DataFrame()
    classes = scoreboard_classes(rows)
    headline = (("INTERRUPTED: " if interrupted else "")
                + f"{summary['detected']}/{len(names)} mutants detected, {summary['survived']} survived, "
                f"{summary['errors']} errors, {summary['equivalent']} equivalent; baseline "
                f"{summary['baseline']}; budget {args.budget_per_mutant:.0f} s per mutant")
    from simrig.history.changes import since_previous

    summary["since_previous"] = since_previous(summary, classes)
    write_report(out, empty, empty, empty, summary, extra_tables={"scoreboard": board, **cov_tables},
                 title="simrig selftest scoreboard", classes=classes, occurrences=empty,
                 headline=headline)
    summary = json.loads((out / "summary.json").read_text())
    summary["report"] = str(out)
    write_summary_md(args, "selftest", summary, classes, headline, str(out / "report.html"))
    if not interrupted:
        record_history(summary, classes)
    if args.json:
        emit_json(without_coverage_data(summary))
        return summary["exit_status"]
    print(f"selftest: {headline}")  # the first line: the run's one-line status
    cols = ["mutant", "status", "phase", "via", "seconds_to_detection", "kind", "shrunk_steps"]
    print(board[cols].to_string(index=False))
    rate = summary["detection_rate"]
    print(f"selftest: detection rate {rate if rate is None else f'{rate:.0%}'} of "
          f"{summary['scored_mutants']} scored mutants (by phase: {summary['detected_by_phase']}); "
          f"control {summary['control']}")
    print(verdict_line(summary["classes"]) + f" — exit {int(failed)}")
    for line in class_rows_for_print(classes):
        print(line)
    if changes_line(summary):
        print(changes_line(summary))
    if coverage_line(summary):
        print(coverage_line(summary) + " (the baseline run)")
    print(f"scoreboard: {out / 'report.html'}")
    return summary["exit_status"]
