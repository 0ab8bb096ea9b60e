"""One ``simrig selftest`` run: the baseline and each mutant in a child, then the scoreboard.

``run_selftest`` runs the children (``simrig.selftest.mutant_runs.run_child``) in this
process's loop or as Ray tasks, keeps every child finished when Ctrl-C stops it, and
ends in ``scoreboard``: the report, the history row, ``--summary-md`` and the lines (or
``--json``) on stdout. The command line is ``simrig.cli.selftest_cmd``'s.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.coverage.collect import from_jsonable
from simrig.coverage.session import CoverageRun, coverage_line, without_coverage_data
from simrig.distributed.cluster import ray_session
from simrig.distributed.tasks import map_in_order
from simrig.errors import EXIT_INTERRUPTED, UsageError
from simrig.findings.classes import class_rows_for_print, verdict_line
from simrig.findings.known import installed_vllm_version
from simrig.history.changes import changes_line, since_previous
from simrig.history.store import record_history
from simrig.interrupt import StopRequests
from simrig.report import writer
from simrig.report.html import emit_json
from simrig.selftest import mutant_runs
from simrig.selftest.catalogue import BY_NAME

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SelftestRun:
    """What one ``simrig selftest`` was asked, every argument checked."""
    names: list[str]  # the mutants, in catalogue order
    budget_s: float  # per mutant
    seed: int
    skip_baseline: bool
    fuzz_only: bool
    steer: bool
    coverage: CoverageRun
    workers: int | None
    ray: str | None
    out: Path
    summary_md: str | None
    json: bool
    say: Callable[..., None]  # progress lines (stderr, or nothing with --quiet)
    started: float  # time.monotonic() when the command started


def run_selftest(r: SelftestRun) -> int:
    """The baseline and the mutants, then the scoreboard of every child that finished."""
    traces = [] if r.fuzz_only else mutant_runs.bundled_traces(ROOT)
    # A child also pays the vLLM import (~15 s) and its replay; give it room past the budget.
    timeout = r.budget_s + 180
    results: list[Any] = []
    with StopRequests(note="stopping after the mutant in flight; the scoreboard keeps every "
                           "mutant finished (again to abandon it)") as stop:
        try:
            run_mutants(r, traces, timeout, results, stop)
        except KeyboardInterrupt:  # a second Ctrl-C: the mutant in flight is dropped
            pass
        with stop.shield():  # a Ctrl-C now would cost the scoreboard: ignored until written
            return scoreboard(r, results, interrupted=stop.requested)


def run_mutants(r: SelftestRun, traces: list[Path], timeout: float, results: list[Any],
                stop: Any) -> None:
    """The baseline, then each mutant, appended to ``results`` as each finishes."""
    baseline_sigs: list[list[str]] = []
    work = r.out.parent / f".{r.out.name}-work"
    cache = mutant_runs.baseline_cache(ROOT)
    if not r.skip_baseline:
        r.say(f"selftest: baseline (unmutated), budget {r.budget_s:.0f} s")
        base = mutant_runs.run_child(mutant_runs.BASELINE, budget_s=r.budget_s, seed=r.seed, baseline=[],
                                     traces=traces, out_dir=work, timeout_s=timeout,
                                     coverage=r.coverage.enabled)
        results.append(base)
        baseline_sigs = base.signatures
        if stop.requested:
            return
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"signatures": baseline_sigs, "fuzz_only": r.fuzz_only,
                                     "budget_s": r.budget_s, "seed": r.seed}))
    elif cache.is_file():
        try:
            baseline_sigs = json.loads(cache.read_text())["signatures"]
        except (ValueError, KeyError) as exc:
            raise UsageError(f"{cache}: unreadable baseline ({exc}); "
                             "run without --skip-baseline once") from None

    if r.workers is not None:  # one Ray task per mutant; results in catalogue order
        calls = [dict(mutant=name, budget_s=r.budget_s, seed=r.seed, baseline=baseline_sigs,
                      traces=traces, out_dir=work, timeout_s=timeout) for name in r.names]
        with ray_session(r.workers, r.ray) as ray:
            results += map_in_order(ray, mutant_runs.run_child, calls, on_done=lambda i, res: r.say(
                f"selftest: {r.names[i]} -> {verdict(r.names[i], res)}", flush=True))
        return
    for i, name in enumerate(r.names, 1):
        if stop.requested:
            return
        r.say(f"selftest: [{i}/{len(r.names)}] {name}", end="", flush=True)
        res = mutant_runs.run_child(name, budget_s=r.budget_s, seed=r.seed, baseline=baseline_sigs,
                                    traces=traces, out_dir=work, timeout_s=timeout)
        results.append(res)
        r.say(f" -> {verdict(name, res)}")


def verdict(name: str, r: Any) -> str:
    m = BY_NAME[name]
    text = ("detected in %.1f s by %s via %s (%s)" % (r.seconds_to_detection, r.phase, r.via, r.kind)
            if r.detected else (r.error or ("equivalent" if m.equivalent else
                                            "control survived" if m.control else "SURVIVED")))
    return ("CONTROL DETECTED (the scoring is broken): " + text) if m.control and r.detected else text


def scoreboard(r: SelftestRun, results: list[Any], interrupted: bool) -> int:
    """The scoreboard report, the history row (not when interrupted), --summary-md and what
    the command prints; returns the exit status."""
    names, out = r.names, r.out
    if not results:  # stopped before the first child finished: nothing to score
        print("simrig selftest: interrupted before the first run finished; no scoreboard written",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    rows = mutant_runs.scoreboard_rows(results)
    board = pd.DataFrame(rows)
    detected = board[board.status == "detected"]
    times = detected.seconds_to_detection.astype(float)
    scored = board[(board.status != "clean") & (board.status != "NOT CLEAN") & ~board.control
                   & ~board.equivalent]
    failed = bool((board.status == "SURVIVED").sum() or (board.status == "error").sum()
                  or (board.status == "CONTROL DETECTED").sum()
                  or (not r.skip_baseline and rows[0]["status"] == "NOT CLEAN"))
    summary = {
        "command": "selftest", "suite": "selftest", "vllm_version": installed_vllm_version(),
        "mutants": len(names), "detected": int(len(detected)),
        "scored_mutants": int(len(scored)),
        "detection_rate": round(len(detected) / len(scored), 3) if len(scored) else None,
        "detected_by_phase": {str(k): int(v) for k, v in detected.phase.value_counts().items()},
        "control": ("skipped" if not board.control.any() else
                    "CONTROL DETECTED" if (board.status == "CONTROL DETECTED").any() else "survived"),
        "fuzz_only": bool(r.fuzz_only),
        "survived": int((board.status == "SURVIVED").sum()),
        "errors": int((board.status == "error").sum()),
        "equivalent": int((board.status == "equivalent").sum()),
        "baseline": "skipped" if r.skip_baseline else rows[0]["status"],
        "median_seconds_to_detection": float(times.median()) if len(times) else None,
        "worst_seconds_to_detection": float(times.max()) if len(times) else None,
        "median_shrunk_steps": float(detected.shrunk_steps.median()) if len(detected) else None,
        "worst_shrunk_steps": float(detected.shrunk_steps.max()) if len(detected) else None,
        "budget_per_mutant_s": r.budget_s, "seed": r.seed, "steer": bool(r.steer),
        "elapsed_s": round(time.monotonic() - r.started, 1), "exit_status": int(failed),
    }
    if interrupted:  # the scoreboard holds the mutants finished before Ctrl-C
        summary.update(stopped_by="signal", exit_status=EXIT_INTERRUPTED,
                       not_run=[n for n in names[len(results) - (not r.skip_baseline):]])
    ran = [res.memcheck for res in results if res.memcheck is not None]
    summary["memcheck"] = bool(ran) and all(ran)  # as the children's kernels ran
    if r.workers is not None:
        summary["workers"] = r.workers
    coverage = r.coverage
    coverage.enabled = coverage.enabled and not r.skip_baseline
    for res in results:  # the baseline's (the unmutated release): mutants are never measured
        if res.mutant == "baseline" and res.coverage:
            coverage.add(from_jsonable(res.coverage))
    cov_tables, cov_summary = coverage.report_parts()
    summary.update(cov_summary)
    summary["exit_status"] = coverage.exit_status(summary["exit_status"], summary)
    empty = pd.DataFrame()
    classes = mutant_runs.scoreboard_classes(rows)
    headline = (("INTERRUPTED: " if interrupted else "")
                + f"{summary['detected']}/{len(names)} mutants detected, {summary['survived']} survived, "
                f"{summary['errors']} errors, {summary['equivalent']} equivalent; baseline "
                f"{summary['baseline']}; budget {r.budget_s:.0f} s per mutant")
    summary["since_previous"] = since_previous(summary, classes)
    writer.write_report(out, empty, empty, empty, summary, extra_tables={"scoreboard": board, **cov_tables},
                        title="simrig selftest scoreboard", classes=classes, occurrences=empty,
                        headline=headline)
    summary = json.loads((out / "summary.json").read_text())
    summary["report"] = str(out)
    writer.write_summary_md(r.summary_md, "selftest", summary, classes, headline, str(out / "report.html"))
    if not interrupted:
        record_history(summary, classes)
    if r.json:
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
