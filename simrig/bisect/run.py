"""``simrig bisect``: plan the legs, search each, diff the MRV2 files, write the report.

    --good G --bad B                 one leg: introduced (G older than B) or fixed (B older)
    --good G1 --bad B --good G2      two legs: G1 .. B introduced, B .. G2 fixed

Report (``--out``, default ``reports/bisect-<UTC time>``; staged and renamed into place):

    summary.json        class, mode, legs (first/last points, candidates, changed files), steps
    steps.csv/.parquet  one row per judged point: leg, point, verdict, reason, seconds, cached
    changed_files.csv   the MRV2 files that differ between each leg's last old and first new point,
                        with how many changed lines mention the class's field, and of those how
                        many name a dtype (files ranked by both)
    leg-<n>.diff        their unified diff
    report.html         the same, self-contained
"""

from __future__ import annotations

import difflib
import html
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.bisect import gitrepo
from simrig.bisect import points as bp
from simrig.bisect.search import FIXED, INTRODUCED, ClassKey, LegResult, search
from simrig.errors import EXIT_CLEAN, EXIT_FINDINGS, UsageError
from simrig.findings.classes import signature_text
from simrig.history.store import record_history
from simrig.report.html import _CSS, emit_json, jsonable, table
from simrig.report.writer import simrig_version, staging_dir, swap_into_place


@dataclass
class LegPlan:
    direction: str
    points: list[bp.Point]
    end_flags: tuple[str, str]
    commits_in_range: int


def plan_legs(goods: list[str], bad: str, repo: Path | None, base: str | None,
              paths: tuple[str, ...]) -> list[LegPlan]:
    if not 1 <= len(goods) <= 2:
        raise UsageError(f"--good: give one or two (one older and one newer than --bad), got {len(goods)}")
    legs = []
    for good in goods:
        gflag, bflag = f"--good {good}", f"--bad {bad}"
        if repo is None:
            try:
                points = bp.release_points(good, bad, "--good", "--bad")
            except UsageError as exc:
                hint = "" if "no such file" not in str(exc) else " (a commit needs --repo PATH)"
                raise UsageError(f"{exc}{hint}") from None
            introduced = points[0].ident == good
            count = len(points)
        else:
            g, b = gitrepo.resolve(repo, good, "--good"), gitrepo.resolve(repo, bad, "--bad")
            if g == b:
                raise UsageError(f"{gflag} and {bflag}: the same commit")
            if gitrepo.is_ancestor(repo, g, b):
                introduced, (points, count) = True, bp.commit_points(repo, g, b, paths, base)
            elif gitrepo.is_ancestor(repo, b, g):
                introduced, (points, count) = False, bp.commit_points(repo, b, g, paths, base)
            else:
                raise UsageError(f"{gflag} and {bflag}: neither is an ancestor of the other")
        legs.append(LegPlan(INTRODUCED if introduced else FIXED, points,
                            (gflag, bflag) if introduced else (bflag, gflag), count))
    if len(legs) == 2 and legs[0].direction == legs[1].direction:
        raise UsageError("--good: two goods must lie on both sides of --bad (one older, one newer)")
    return legs


def _site_root(python: str) -> Path:
    code = "import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec('vllm').origin)))"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return Path(proc.stdout.strip())


def release_diff(a: bp.Point, b: bp.Point, paths: tuple[str, ...]) -> tuple[list[dict[str, str]], str]:
    """The MRV2 .py files that differ between two installed releases, and their diff."""
    root_a, root_b = _site_root(a.python), _site_root(b.python)

    def files(root: Path) -> dict[str, Path]:
        out = {}
        for p in paths:
            base = root / p
            found = [base] if base.is_file() else sorted(base.rglob("*.py")) if base.is_dir() else []
            out.update({str(f.relative_to(root)): f for f in found if "__pycache__" not in f.parts})
        return out

    fa, fb = files(root_a), files(root_b)
    rows, chunks = [], []
    for name in sorted(set(fa) | set(fb)):
        old = fa[name].read_text(errors="replace").splitlines(True) if name in fa else []
        new = fb[name].read_text(errors="replace").splitlines(True) if name in fb else []
        if old == new:
            continue
        rows.append({"status": "A" if name not in fa else "D" if name not in fb else "M", "path": name})
        chunks.extend(difflib.unified_diff(old, new, f"{a.label}/{name}", f"{b.label}/{name}"))
    return rows, "".join(chunks)


DTYPE_WORDS = ("dtype", "int32", "int64", "intp", "bool")


def mentions(diff: str, name: str) -> dict[str, tuple[int, int]]:
    """Per changed file: how many of its changed lines mention ``name`` (the class's field),
    and how many of those also name a dtype."""
    out: dict[str, tuple[int, int]] = {}
    current = ""
    leaf = name.rsplit(".", 1)[-1]
    for line in diff.splitlines():
        if line.startswith(("+++ ", "--- ")):
            path = line[4:].split("\t")[0]
            if path != "/dev/null":
                current = path.split("/", 1)[1] if "/" in path else path
            continue
        if leaf and line[:1] in "+-" and leaf in line:
            n, typed = out.get(current, (0, 0))
            out[current] = (n + 1, typed + any(w in line for w in DTYPE_WORDS))
    return out


def run(trace: Path, key: ClassKey, legs: list[LegPlan], judge: bp.Judge, repo: Path | None,
        paths: tuple[str, ...]) -> dict[str, Any]:
    started = time.perf_counter()
    results: list[tuple[LegPlan, LegResult]] = []
    steps: list[dict[str, Any]] = []
    for n, leg in enumerate(legs):
        labels = [p.label for p in leg.points]

        def test(i: int, leg: LegPlan = leg, n: int = n) -> Any:
            p = leg.points[i]
            again = any(s["ident"] == p.ident for s in steps)  # judged for another leg already
            verdict = judge(p)
            steps.append({"leg": n, "direction": leg.direction, "point": p.label, "ident": p.ident,
                          "kind": p.kind, "subject": p.subject, "runs_on": p.base,
                          "verdict": verdict.verdict, "reason": verdict.reason,
                          "seconds": round(verdict.seconds, 2), "cached": verdict.cached or again,
                          "exit_status": verdict.detail.get("exit_status", -1),
                          "occurrences": verdict.detail.get("occurrences", 0)})
            return verdict

        results.append((leg, search(labels, test, leg.direction, leg.end_flags)))
    out_legs = []
    for n, (leg, res) in enumerate(results):
        old, new = leg.points[res.lo], leg.points[res.hi]
        if repo is not None:
            changed, diff = (gitrepo.changed_files(repo, old.ident, new.ident, paths),
                             gitrepo.diff(repo, old.ident, new.ident, paths))
        else:
            changed, diff = release_diff(old, new, paths)
        hits = mentions(diff, key.field)
        changed = sorted(({**row, "mentions_field": hits.get(row["path"], (0, 0))[0],
                           "with_dtype": hits.get(row["path"], (0, 0))[1]} for row in changed),
                         key=lambda r: (-r["with_dtype"], -r["mentions_field"], r["path"]))
        out_legs.append({
            "leg": n, "direction": leg.direction, "sentence": res.sentence(),
            "first_new": res.first_new, "first_new_ident": new.ident, "first_new_subject": new.subject,
            "last_old": res.last_old, "last_old_ident": old.ident,
            "candidates": res.candidates, "ambiguous": bool(res.ambiguous),
            "points": len(leg.points), "commits_in_range": leg.commits_in_range,
            "tested": len(res.tested), "changed_files": changed, "diff": diff})
    return {"command": "bisect", "suite": f"bisect {key.text}", "class": key.text,
            "signature": _signature(key), "mode": "commits" if repo is not None else "releases",
            "repo": str(repo) if repo is not None else "", "trace": str(trace),
            "overlay_paths": list(paths), "stages": judge.stages, "legs": out_legs, "steps": steps,
            "vllm_version": legs[0].points[-1].base, "elapsed_s": round(time.perf_counter() - started, 2),
            "exit_status": EXIT_FINDINGS if any(leg["ambiguous"] for leg in out_legs) else EXIT_CLEAN,
            **_history_fields(out_legs)}


def bisect_command(trace: Path, key: ClassKey, *, good: list[str], bad: str, repo: Path | None,
                   base: str | None, paths: tuple[str, ...], out: Path, json_out: bool, log: Any,
                   **judging: Any) -> int:
    """``simrig bisect`` from checked arguments: every leg searched (``judging``: the
    ``simrig.bisect.points.Judge`` keywords), the report, the history row and what the
    command prints (or ``--json``); returns the exit status."""
    legs = plan_legs(good, bad, repo, base, paths)
    judge = bp.Judge(trace, key, repo=repo, paths=paths, log=log, **judging)
    summary = run(trace, key, legs, judge, repo, paths)
    report = write_report(summary, out)
    summary["report"] = str(report)
    brief = [{k: v for k, v in leg.items() if k != "diff"} for leg in summary["legs"]]
    history = {k: v for k, v in summary.items() if k not in ("steps", "legs")}
    record_history({**history, "bisect_legs": brief}, None)
    if json_out:
        emit_json({**summary, "legs": brief})
        return summary["exit_status"]
    for line in headline_lines(summary):
        print(line)
    print(f"report: {report / 'report.html'}")
    return summary["exit_status"]


def _signature(key: ClassKey) -> str:
    return signature_text(key.kind, key.stage, key.field, key.exception_type)


def _history_fields(legs: list[dict[str, Any]]) -> dict[str, str]:
    """introduced_in / last_good / fixed_in / last_bad, as ``simrig history`` shows them."""
    out = {}
    for leg in legs:
        label = ", ".join(leg["candidates"]) if leg["ambiguous"] else leg["first_new"]
        if leg["direction"] == INTRODUCED:
            out.update(introduced_in=label, last_good=leg["last_old"])
        else:
            out.update(fixed_in=label, last_bad=leg["last_old"])
    return out


def headline_lines(summary: dict[str, Any]) -> list[str]:
    lines = [f"bisect {summary['class']} over {summary['mode']} ({len(summary['steps'])} steps, "
             f"{sum(not s['cached'] for s in summary['steps'])} replays, {summary['elapsed_s']:.0f} s)"]
    for leg in summary["legs"]:
        subject = f" \"{leg['first_new_subject']}\"" if leg["first_new_subject"] else ""
        lines.append(f"  {leg['sentence']}{subject}")
        field = summary["class"].split(":")[2]
        for row in leg["changed_files"][:12]:
            hits = (f"  ({row['mentions_field']} changed line(s) mention {field}, {row['with_dtype']} "
                    "with a dtype)") if row["mentions_field"] else ""
            lines.append(f"    {row['status']} {row['path']}{hits}")
        if len(leg["changed_files"]) > 12:
            lines.append(f"    ... {len(leg['changed_files']) - 12} more MRV2 file(s) in changed_files.csv")
        if not leg["changed_files"]:
            lines.append("    (no MRV2 file differs: the change is outside the overlaid paths)")
    for s in summary["steps"]:
        lines.append(f"  step {s['point']:<12} {s['verdict']:<4} {s['seconds']:6.1f} s"
                     f"{' cached' if s['cached'] else ''}{': ' + s['reason'] if s['reason'] else ''}")
    return lines


def write_report(summary: dict[str, Any], out: Path) -> Path:
    tmp = staging_dir(out, "report")
    summary = {"simrig_version": simrig_version(), **summary}
    try:
        steps = pd.DataFrame(summary["steps"])
        changed = pd.DataFrame([{"leg": leg["leg"], **row} for leg in summary["legs"]
                                for row in leg["changed_files"]], columns=["leg", "status", "path", "mentions_field", "with_dtype"])
        for name, frame in (("steps", steps), ("changed_files", changed)):
            frame.to_parquet(tmp / f"{name}.parquet", index=False)
            frame.to_csv(tmp / f"{name}.csv", index=False)
        for leg in summary["legs"]:
            (tmp / f"leg-{leg['leg']}.diff").write_text(leg["diff"])
        slim = {**summary, "legs": [{k: v for k, v in leg.items() if k != "diff"}
                                    for leg in summary["legs"]]}
        (tmp / "summary.json").write_text(json.dumps(jsonable(slim), indent=2, sort_keys=True) + "\n")
        (tmp / "report.html").write_text(render(summary, steps, changed), encoding="utf-8")
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def render(summary: dict[str, Any], steps: pd.DataFrame, changed: pd.DataFrame) -> str:
    e = html.escape
    bad = summary["exit_status"] != 0
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>simrig bisect</title>"
             f"<style>{_CSS}</style></head><body><h1>simrig bisect: {e(summary['signature'])}</h1>"]
    for leg in summary["legs"]:
        parts.append(f"<p class='banner {'bad' if leg['ambiguous'] else 'good'}'>{e(leg['sentence'])}"
                     f"{' — ' + e(leg['first_new_subject']) if leg['first_new_subject'] else ''}</p>")
    parts.append(f"<p class='facts'>{e(summary['mode'])} · trace {e(summary['trace'])} · stages "
                 f"{e(summary['stages'])} · {len(steps)} point(s) judged in {summary['elapsed_s']:.0f} s"
                 f"{' · ' + e(summary['repo']) if summary['repo'] else ''} · exit "
                 f"{summary['exit_status']}{' (ambiguous)' if bad else ''}</p>")
    parts.append("<h2>Steps (in the order judged)</h2>" + table(steps))
    parts.append("<h2>MRV2 files changed between the last old and the first new point</h2>"
                 + table(changed))
    for leg in summary["legs"]:
        parts.append(f"<h3>leg {leg['leg']} ({e(leg['direction'])}): {e(leg['last_old'])} → "
                     f"{e(leg['first_new'])}</h3><details><summary>diff ({len(leg['diff'].splitlines())}"
                     f" lines; leg-{leg['leg']}.diff)</summary><pre>{e(leg['diff'][:400_000])}</pre>"
                     "</details>")
    parts.append("</body></html>")
    return "\n".join(parts)
