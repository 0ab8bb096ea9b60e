"""What changed since the previous run of the same suite, read from the history store.

``since_previous`` compares this run's summary and class table with the latest
recorded run of its suite on the same vLLM release (on any release with
``--across-releases``, ``across_releases()``): classes appeared, gone (fixed, or not
reached), verdicts changed, metrics. Every report writes it into summary.json as
``since_previous``; the words for it are ``simrig.views.changes_text``'s.

See docs/history.md, 'What changed since the previous run'.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.findings.classes import verdict_counts
from simrig.history.store import RUN_COLUMNS, StoreListing, _read_all, _summary, history_dir, replays_all_of
from simrig.views.changes_text import change_lines, run_scope

MAX_LISTED = 40  # classes listed per change kind (the counts are always whole)

# (summary key, history column, label): the numbers compared run to run
METRICS = (("steps_per_s", "steps_per_s", "steps/s"),
           ("examples_per_s", "examples_per_s", "examples/s"),
           ("detected", "detected", "mutants detected"),
           ("coverage_lines_pct", "coverage_lines_pct", "coverage of lines (%)"),
           ("coverage_branches_pct", "coverage_branches_pct", "coverage of branches (%)"),
           ("new", "new", "new classes"), ("known", "known", "known classes"),
           ("expected", "expected", "expected classes"))


# set by --across-releases (simrig.cli.dispatch) for the command and its workers
ACROSS_RELEASES_ENV = "SIMRIG_ACROSS_RELEASES"


def across_releases() -> bool:
    """Whether runs are compared with runs of their suite on any vLLM release, not only
    on their own (``--across-releases``, or SIMRIG_ACROSS_RELEASES=1)."""
    return os.environ.get(ACROSS_RELEASES_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def since_previous(summary: dict[str, Any], classes: pd.DataFrame | None,
                   root: str | Path | None = None, *, any_release: bool | None = None) -> dict[str, Any]:
    """The changes of this run (``summary``, ``classes``: not yet in the store) against the
    latest recorded run of its suite on its vLLM release (``any_release``: on any release;
    default ``across_releases()``). Never raises: a store it cannot read is a status."""
    store = Path(root) if root is not None else history_dir()
    if store is None:
        return {"status": "off"}
    try:
        return _compare(store, summary, classes, across_releases() if any_release is None else any_release)
    except Exception as exc:  # noqa: BLE001 -- the run's verdict never depends on the history
        return {"status": "unreadable", "why": " ".join(str(exc).split()) or type(exc).__name__}


def changes_line(summary: dict[str, Any]) -> str:
    """'since the previous run of fuzz valid on vLLM 0.33.0: ...' for the terminal ('' when
    the summary has no changes)."""
    changes = summary.get("since_previous")
    lines = change_lines(changes)
    if not lines:
        return ""
    compared = changes.get("status") == "compared"
    return (f"since the previous run of {run_scope(changes)}: " if compared else "") + "; ".join(lines)


def _compare(store: Path, summary: dict[str, Any], classes: pd.DataFrame | None,
             any_release: bool) -> dict[str, Any]:
    suite = str(summary.get("suite") or summary.get("command") or "")
    release = str(summary.get("vllm_version") or "")
    runs = _read_all(store / "runs", RUN_COLUMNS, StoreListing())
    runs = runs[runs["suite"] == suite].sort_values(["created_utc", "run_id"], kind="stable")
    scope = {"suite": suite, "vllm": release, "any_release": any_release}
    others = sorted(set(runs["vllm_version"].astype(str)) - {release})
    if not any_release:
        runs = runs[runs["vllm_version"] == release]
    if runs.empty:  # a suite's first run on this release: nothing is new since anything
        return {"status": "first", **scope, **({} if any_release else {"other_releases": others})}
    prev = runs.iloc[-1]
    before_classes = _classes_of(store, str(prev["run_id"]))
    classes = classes if classes is not None else pd.DataFrame(columns=["signature", "verdict"])
    now = dict(zip(classes["signature"].astype(str), classes["verdict"].astype(str))) if len(classes) else {}
    before = (dict(zip(before_classes["signature"].astype(str), before_classes["verdict"].astype(str)))
              if len(before_classes) else {})
    proven = replays_all_of(summary, _summary(prev["summary_json"]))
    appeared = [{"signature": s, "verdict": v} for s, v in sorted(now.items(), key=_new_first) if s not in before]
    gone = [{"signature": s, "verdict": v, "why": "fixed" if proven else "not reached"}
            for s, v in sorted(before.items(), key=_new_first) if s not in now]
    changed = [{"signature": s, "before": before[s], "now": v} for s, v in sorted(now.items())
               if s in before and before[s] != v]
    counts = verdict_counts(classes) if len(classes) else {"new": 0, "known": 0, "expected": 0}
    cov = summary.get("coverage") if isinstance(summary.get("coverage"), dict) else {}
    current = {**summary, **counts, "coverage_lines_pct": cov.get("lines_pct"),
               "coverage_branches_pct": cov.get("branches_pct")}
    metrics = []
    for key, column, label in METRICS:
        a, b = _number(prev.get(column)), _number(current.get(key))
        if a is None or b is None:
            continue
        metrics.append({"name": label, "before": a, "now": b, "change": round(b - a, 6)})
    return {"status": "compared", **scope, "previous_run": str(prev["run_id"]),
            "previous_created_utc": str(prev["created_utc"]),
            "previous_vllm": str(prev["vllm_version"]), "previous_exit_status": int(prev["exit_status"]),
            "appeared_count": len(appeared), "gone_count": len(gone),
            "appeared": appeared[:MAX_LISTED], "gone": gone[:MAX_LISTED],
            "verdict_changed": changed[:MAX_LISTED], "metrics": metrics}


def _classes_of(store: Path, run_id: str) -> pd.DataFrame:
    path = store / "classes" / f"{run_id}.parquet"
    return pd.read_parquet(path) if path.is_file() else pd.DataFrame(columns=["signature", "verdict"])


def _new_first(item: tuple[str, str]) -> tuple[int, str]:
    return ({"new": 0, "expected": 1, "known": 2}.get(item[1], 3), item[0])


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
    value = float(value)
    return value if math.isfinite(value) else None
