"""Nightly history: every replay / fuzz / selftest run, and its finding classes.

A parquet dataset in the reports folder (``SIMRIG_HISTORY``, default
``reports/history``; ``none`` turns recording off), one file per run per
table, so appends never rewrite earlier nights and two runs never collide:

    reports/history/
      runs/<run_id>.parquet      one row: command, time, vLLM version, exit status,
                                 steps/s, examples/s, mutants detected, class counts
      classes/<run_id>.parquet   one row per finding class of that run

In a notebook: ``pd.read_parquet("reports/history/runs")`` and
``pd.read_parquet("reports/history/classes")``.

A run's *suite* is what it ran (``replay traces/samples``, ``fuzz valid``,
``selftest``): runs of one suite are comparable night to night.
``class_timeline`` turns the rows into one line per class and suite: first
seen, last seen, the vLLM versions it was seen on, and ``fixed since`` (the
first later run of the same suite that no longer shows it).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

RUN_COLUMNS = {  # column -> dtype: a fixed schema, so every file reads as one dataset
    "run_id": "string", "command": "string", "suite": "string", "created_utc": "string",
    "vllm_version": "string", "device": "string", "exit_status": "int64", "steps": "float64", "steps_per_s": "float64",
    "examples": "float64", "examples_per_s": "float64", "mutants": "float64",
    "detected": "float64", "elapsed_s": "float64", "vllm_share": "float64",
    "classes": "int64", "new": "int64", "known": "int64", "expected": "int64",
    "report": "string", "summary_json": "string"}
CLASS_COLUMNS = {
    "run_id": "string", "command": "string", "suite": "string", "created_utc": "string", "vllm_version": "string",
    "signature": "string", "kind": "string", "stage": "string", "field": "string",
    "exception_type": "string", "verdict": "string", "occurrences": "int64"}


def history_dir() -> Path | None:
    raw = os.environ.get("SIMRIG_HISTORY", "reports/history")
    return None if raw.strip().lower() in ("", "none", "off") else Path(raw)


def new_run_id(created_utc: str) -> str:
    stamp = created_utc.replace("-", "").replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
    return f"{stamp}-{uuid.uuid4().hex[:6]}"


def run_row(summary: dict[str, Any], counts: dict[str, int], run_id: str) -> dict[str, Any]:
    def num(key: str) -> float:
        value = summary.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")

    share = summary.get("time_share") or {}
    command = str(summary.get("command", ""))
    return {"run_id": run_id, "command": command, "suite": str(summary.get("suite") or command),
            "created_utc": str(summary.get("created_utc", "")),
            "vllm_version": str(summary.get("vllm_version", "")),
            "device": str(summary.get("device", "")),
            "exit_status": int(summary.get("exit_status", 0) or 0),
            "steps": num("steps"), "steps_per_s": num("steps_per_s"), "examples": num("examples"),
            "examples_per_s": num("examples_per_s"), "mutants": num("mutants"),
            "detected": num("detected"), "elapsed_s": num("elapsed_s"),
            "vllm_share": float(share.get("vllm_share", float("nan"))),
            "classes": int(counts.get("classes", 0)), "new": int(counts.get("new", 0)),
            "known": int(counts.get("known", 0)), "expected": int(counts.get("expected", 0)),
            "report": str(summary.get("report", "")),
            "summary_json": json.dumps(summary, sort_keys=True, default=str)}


def _typed(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    return frame.astype(columns)


def _write_atomic(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_run(root: str | Path, summary: dict[str, Any], classes: pd.DataFrame | None) -> str:
    """Write one run (and its classes) into the store; returns the run id."""
    from simrig.report.classes import verdict_counts

    root = Path(root)
    classes = classes if classes is not None else pd.DataFrame({"verdict": []})
    summary = dict(summary)
    summary.setdefault("created_utc", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    run_id = new_run_id(summary["created_utc"])
    run = run_row(summary, verdict_counts(classes), run_id)
    class_rows = []
    for c in classes.to_dict("records"):
        class_rows.append({"run_id": run_id, "command": run["command"], "suite": run["suite"],
                           "created_utc": run["created_utc"], "vllm_version": run["vllm_version"],
                           **{k: c.get(k, "") for k in ("signature", "kind", "stage", "field",
                                                        "exception_type", "verdict")},
                           "occurrences": int(c.get("occurrences", 0))})
    # classes first: a run row is only written once its classes are there
    _write_atomic(_typed(class_rows, CLASS_COLUMNS), root / "classes" / f"{run_id}.parquet")
    _write_atomic(_typed([run], RUN_COLUMNS), root / "runs" / f"{run_id}.parquet")
    return run_id


def _read_all(folder: Path, columns: dict[str, str]) -> pd.DataFrame:
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    frames = [pd.read_parquet(f) for f in files]
    frames = [f for f in frames if len(f)]
    if not frames:
        return _typed([], columns)
    return pd.concat(frames, ignore_index=True).astype(columns)


def load_history(root: str | Path, since: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, classes) sorted by time; ``since``: an ISO date/time, runs from then on."""
    root = Path(root)
    runs = _read_all(root / "runs", RUN_COLUMNS)
    classes = _read_all(root / "classes", CLASS_COLUMNS)
    classes = classes[classes["run_id"].isin(set(runs["run_id"]))]  # a run row means complete
    if since:
        runs = runs[runs["created_utc"] >= since]
        classes = classes[classes["run_id"].isin(set(runs["run_id"]))]
    runs = runs.sort_values(["created_utc", "run_id"], kind="stable").reset_index(drop=True)
    return runs, classes.reset_index(drop=True)


def class_timeline(runs: pd.DataFrame, classes: pd.DataFrame) -> pd.DataFrame:
    """One row per (suite, class signature): verdict (latest), runs seen, first/last
    seen, vLLM versions, and ``fixed_since``: the first run of the same suite after
    the last one that showed it ("" while it still shows)."""
    columns = ["suite", "signature", "verdict", "runs_seen", "occurrences", "first_seen",
               "first_run", "last_seen", "last_run", "vllm_versions", "fixed_since",
               "fixed_since_run"]
    if runs.empty or classes.empty:
        return pd.DataFrame(columns=columns)
    order = {rid: i for i, rid in enumerate(runs["run_id"])}
    when = dict(zip(runs["run_id"], runs["created_utc"]))
    rows = []
    for (suite, signature), group in classes.groupby(["suite", "signature"], sort=True):
        group = group.assign(_order=group["run_id"].map(order)).sort_values("_order")
        first, last = group.iloc[0], group.iloc[-1]
        later = runs[(runs["suite"] == suite)
                     & (runs["run_id"].map(order) > order[last["run_id"]])]
        fixed_run = later["run_id"].iloc[0] if len(later) else ""
        rows.append({"suite": suite, "signature": signature, "verdict": last["verdict"],
                     "runs_seen": int(group["run_id"].nunique()),
                     "occurrences": int(group["occurrences"].sum()),
                     "first_seen": when[first["run_id"]], "first_run": first["run_id"],
                     "last_seen": when[last["run_id"]], "last_run": last["run_id"],
                     "vllm_versions": ",".join(sorted(set(group["vllm_version"].astype(str)))),
                     "fixed_since": when.get(fixed_run, "") if fixed_run else "",
                     "fixed_since_run": fixed_run})
    out = pd.DataFrame(rows, columns=columns)
    out["_fixed"] = out["fixed_since"] != ""
    return out.sort_values(["_fixed", "suite", "signature"]).drop(columns="_fixed").reset_index(drop=True)


def run_trends(runs: pd.DataFrame, classes: pd.DataFrame) -> pd.DataFrame:
    """Per run: classes new / known / expected, classes fixed since the previous run of
    the same suite, steps/s, examples/s, mutants detected."""
    cols = ["run_id", "suite", "created_utc", "vllm_version", "exit_status", "new", "known",
            "expected", "fixed", "steps_per_s", "examples_per_s", "detected", "mutants"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    seen = {rid: set(g["signature"]) for rid, g in classes.groupby("run_id")}
    previous: dict[str, set[str]] = {}
    fixed = []
    for r in runs.itertuples(index=False):
        now = seen.get(r.run_id, set())
        fixed.append(len(previous.get(r.suite, set()) - now))
        previous[r.suite] = now
    return runs.assign(fixed=fixed)[cols]
