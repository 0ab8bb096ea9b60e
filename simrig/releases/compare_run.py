"""``simrig compare``: the same traces under two vLLMs, each in its own process.

    side A (venv A) ◄─round 0─ driver ─round 0─► side B (venv B)      round 0 also collects
                    ◄─round 1─        ─round 1─►                       findings, contract, values
                        ...   A, B, A, B ... in the same time window
    A/ and B/ tables ──► diff.py ──► one report (written atomically)

A side that cannot start (its vLLM does not import, or the adapter does not
know its API) ends the command with one line, exit 2, and no report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.errors import UsageError
from simrig.findings.classes import KNOWN, NEW, ClassStats, class_frame
from simrig.history.store import record_history
from simrig.releases import diff
from simrig.releases.envs import PROJECT, SideSpec
from simrig.releases.fuzzsides import fuzz_classes
from simrig.releases.side import PREFIX


@dataclass
class SideProcess:
    spec: SideSpec
    out: Path
    proc: subprocess.Popen | None = None
    rounds: list[dict[str, float]] = field(default_factory=list)

    def start(self, stages: tuple[str, ...], traces: list[str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.stderr = self.out.with_suffix(".stderr")  # a file: a full pipe would stall the side
        with self.stderr.open("w") as err:
            self.proc = subprocess.Popen(
                [self.spec.python, "-m", "simrig.releases.side", str(self.out), ",".join(stages),
                 *traces], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                text=True, cwd=PROJECT, env=env)

    def read(self) -> dict[str, Any]:
        """The next protocol message (vLLM's own output is skipped)."""
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                msg = json.loads(line[len(PREFIX):])
                if "error" in msg:
                    raise UsageError(f"--vllm {self.spec.spec}: {msg['error']}")
                return msg
        err = self.stderr.read_text(errors="replace").strip().splitlines()
        last = next((ln for ln in reversed(err) if ln.strip()), "no output")
        raise UsageError(f"--vllm {self.spec.spec}: the side process ended: {last}")

    def round(self, k: int) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"round {k}\n")
        self.proc.stdin.flush()
        self.rounds.append(self.read()["stage_s"])

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()

    def tables(self) -> dict[str, Any]:
        unstable = self.out / "unstable.json"
        return {name: pd.read_parquet(self.out / f"{name}.parquet")
                for name in ("classes", "contract", "values")} | {
            "meta": json.loads((self.out / "meta.json").read_text()),
            "unstable": {tuple(x) for x in json.loads(unstable.read_text())}
            if unstable.is_file() else set()}


@dataclass
class Comparison:
    a: dict[str, Any]
    b: dict[str, Any]
    classes: pd.DataFrame
    contract: pd.DataFrame
    latency: pd.DataFrame
    values: pd.DataFrame
    fields_compared: int
    summary: dict[str, Any]

    @property
    def exit_status(self) -> int:
        return 1 if self.summary["classes"]["B only"] else 0


def compare(a: SideSpec, b: SideSpec, traces: list[str], *, stages: tuple[str, ...],
            rounds: int, work: Path, log=print) -> Comparison:
    """Run both sides interleaved; the tables of the side-by-side report."""
    sides = [SideProcess(a, work / "A"), SideProcess(b, work / "B")]
    try:
        for side in sides:
            side.start(stages, traces)
        for side in sides:
            side.read()  # ready, or one line naming what failed
        for k in range(rounds):
            for side in sides:  # A, B, A, B ...: both see the same load
                side.round(k)
            log(f"compare: round {k + 1}/{rounds} done")
    finally:
        for side in sides:
            side.stop()
    ta, tb = sides[0].tables(), sides[1].tables()
    classes = diff.class_diff(ta["classes"], tb["classes"])
    contract = diff.contract_diff(ta["contract"], tb["contract"])
    # Round 1 is a warm-up (first kernel launches, caches) and also collects the
    # tables: only later rounds are timed when there are any.
    timed = slice(1, None) if rounds > 1 else slice(None)
    lat, unshared = diff.latency(sides[0].rounds[timed], sides[1].rounds[timed])
    unstable = ta["unstable"] | tb["unstable"]  # differ between two runs of one vLLM
    values, compared = diff.value_diff(diff.drop_fields(ta["values"], unstable),
                                       diff.drop_fields(tb["values"], unstable))
    summary = {
        "a": {"spec": a.spec, **ta["meta"]}, "b": {"spec": b.spec, **tb["meta"]},
        "traces": traces, "stages": list(stages), "rounds": rounds,
        "timed_rounds": len(sides[0].rounds[timed]),
        "classes": {s: int((classes["side"] == s).sum()) for s in (diff.A_ONLY, diff.B_ONLY, diff.BOTH)},
        "contract": {s: int((contract["status"] == s).sum())
                     for s in (diff.SAME, diff.DIFFERS, diff.A_ONLY, diff.B_ONLY)},
        "value_fields_compared": compared, "value_fields_differing": len(values),
        "value_fields_nondeterministic": sorted(f"{s}.{f}" for s, f in unstable),
        "value_stability_checked": rounds >= 2,
        "latency_not_compared": unshared,
        "latency": {row.stage: {"ratio": round(row.ratio_b_over_a, 3),
                                "ci": [round(row.ci_low, 3), round(row.ci_high, 3)],
                                "verdict": row.verdict} for row in lat.itertuples()},
    }
    return Comparison(ta, tb, classes, contract, lat, values, compared, summary)


def compare_command(a: SideSpec, b: SideSpec, traces: list[str], *, stages: tuple[str, ...], rounds: int,
                    fuzz_budget: float, out: Path) -> int:
    """``simrig compare`` from checked arguments: both sides (and with ``fuzz_budget`` the same
    seeded campaign on each), the report, the history row and what the command prints."""
    with tempfile.TemporaryDirectory(prefix="simrig-compare-") as work:
        log = (lambda line: print(line, file=sys.stderr))
        result = compare(a, b, traces, stages=stages, rounds=rounds, work=Path(work), log=log)
        if fuzz_budget > 0:
            fuzz_classes(result, a, b, fuzz_budget, Path(work), log=log)
        report = write(result, out)
    written = json.loads((report / "summary.json").read_text())
    record_history(written, pd.read_parquet(report / "classes.parquet"))
    for line in headline(result):
        print(line)
    print(f"report: {report / 'report.html'}")
    return result.exit_status


def write(result: Comparison, out: Path) -> Path:
    """The report directory, written by the shared report writer (atomically).

    The class table speaks the reports' vocabulary: a class B has and A does
    not is *new* (it is what fails the compare, known to B's table or not);
    a class both have, or only A, is *known* (its side says which). The
    side-by-side class diff is ``class_sides``.
    """
    from simrig.report.writer import write_report  # late-bound: tests monkeypatch writer.write_report

    if out.exists() and any(out.iterdir()) and not (out / "summary.json").is_file():
        raise UsageError(f"--out: {out} is a non-empty directory that is not a simrig report")
    s = result.summary
    summary = {"command": "compare", "suite": f"compare {s['a']['spec']} {s['b']['spec']}",
               "vllm_version": s["b"]["vllm_version"],
               **{k: v for k, v in s.items() if k != "classes"},
               "class_sides": s["classes"], "exit_status": result.exit_status}
    empty = pd.DataFrame()
    tables = {"class_sides": result.classes, "contract_diff": result.contract,
              "latency": result.latency, "value_diff": result.values}
    first = headline(result)
    return write_report(out, empty, empty, empty, summary, extra_tables=tables,
                        title=f"simrig compare: vLLM {s['a']['vllm_version']} (A) vs "
                              f"{s['b']['vllm_version']} (B)",
                        classes=class_verdicts(result.classes), occurrences=empty,
                        headline="; ".join(first[:2]))


def class_verdicts(sides: pd.DataFrame) -> pd.DataFrame:
    """The class diff as one row per class with a verdict (report.classes)."""
    stats = []
    for row in sides.itertuples():
        b_only = row.side == diff.B_ONLY
        known_by = row.known_by_b if row.side != diff.A_ONLY else row.known_by_a
        note = {diff.A_ONLY: "only in A (gone in B)", diff.B_ONLY: "only in B (new in B)",
                diff.BOTH: "in both"}[row.side]
        stats.append(ClassStats(
            kind=row.kind, stage=row.stage, field=row.field, exception_type=row.exception_type,
            verdict=NEW if b_only else KNOWN, occurrences=int(row.count_a) + int(row.count_b),
            checks={row.check}, message=f"{note}: A x{int(row.count_a)}, B x{int(row.count_b)}",
            explanation=note + (f"; explained by {known_by}" if known_by else "")))
    return class_frame(stats)


def headline(result: Comparison) -> list[str]:
    """The lines the command prints (the report's headline rows)."""
    s = result.summary
    lines = [f"A = vLLM {s['a']['vllm_version']} ({s['a']['spec']}), "
             f"B = vLLM {s['b']['vllm_version']} ({s['b']['spec']})"]
    c = s["classes"]
    lines.append(f"finding classes: {c['A only']} A only, {c['B only']} B only, {c['both']} both")
    for row in result.classes.itertuples():
        if row.side != diff.BOTH:
            known = row.known_by_b if row.side == diff.B_ONLY else row.known_by_a
            lines.append(f"  [{row.side}] {row.kind} {row.stage}.{row.field or '-'} ({row.check}"
                         f"{', ' + row.exception_type if row.exception_type else ''})"
                         + (f" known: {known}" if known else " NEW"))
    k = s["contract"]
    lines.append(f"dtype contract: {k['same']} same, {k['differs']} differ, "
                 f"{k['A only']} only in A, {k['B only']} only in B")
    for row in result.contract[result.contract["status"] == diff.DIFFERS].itertuples():
        lines.append(f"  {row.stage}.{row.field}: A {row.a} -> B {row.b}")
    lines.append(f"values: {s['value_fields_differing']} of {s['value_fields_compared']} "
                 "(stage, field) pairs differ on the same step"
                 + (f" ({len(s['value_fields_nondeterministic'])} nondeterministic, not compared: "
                    f"{', '.join(s['value_fields_nondeterministic'])})"
                    if s['value_fields_nondeterministic'] else "")
                 + ("" if s["value_stability_checked"] else " (one round: stability not checked)"))
    for row in result.values.itertuples():
        lines.append(f"  {row.stage}.{row.field}: {row.differing}/{row.compared} steps "
                     f"(first: {Path(row.first_trace).name} step {row.first_step})")
    lines.append("latency B/A (95% bootstrap CI over interleaved rounds):")
    for row in result.latency.itertuples():
        lines.append(f"  {row.stage:<12} {row.ratio_b_over_a:6.3f} "
                     f"[{row.ci_low:.3f}, {row.ci_high:.3f}] {row.verdict}")
    for item in s["latency_not_compared"]:
        lines.append(f"  not compared (one side only): {item}")
    return lines
