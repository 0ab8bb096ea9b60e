"""Nightly history: every replay / fuzz / selftest run, and its finding classes.

A parquet dataset (``SIMRIG_HISTORY``, default ``reports/history``; ``none`` turns it
off), one file per run per table, so appends never rewrite earlier nights
(``append_run``) and readers skip what is not a complete run (``load_history``).
``class_timeline`` gives each class its first and last sighting, its bisect results
(``bisect_results``) and "fixed since" or "not seen since" (``replays_all_of``).

See docs/history.md.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.coverage.analysis import analyze
from simrig.coverage.collect import from_jsonable
from simrig.coverage.reasons import Reasons
from simrig.errors import EXIT_INTERRUPTED, EXIT_RIG_ERROR
from simrig.findings.classes import verdict_counts

RUN_COLUMNS = {  # column -> dtype: a fixed schema, so every file reads as one dataset
    "run_id": "string", "command": "string", "suite": "string", "created_utc": "string",
    "vllm_version": "string", "device": "string", "exit_status": "int64", "steps": "float64", "steps_per_s": "float64",
    "examples": "float64", "shrink_runs": "float64", "examples_per_s": "float64", "mutants": "float64",
    "detected": "float64", "elapsed_s": "float64", "vllm_share": "float64",
    "classes": "int64", "new": "int64", "known": "int64", "expected": "int64",
    "report": "string", "summary_json": "string",
    # coverage of vLLM's MRV2 code (runs with --coverage; NaN otherwise)
    "coverage_lines_pct": "float64", "coverage_branches_pct": "float64",
    "coverage_unexplained": "float64",
    "memcheck": "boolean"}  # its kernels ran under memcheck (NA: a store written before the column)
COVERAGE_COLUMNS = {  # coverage/<run_id>.parquet: one row per branch arc of a driven function
    "run_id": "string", "vllm_version": "string", "file": "string", "function": "string",
    "line": "int64", "to_line": "int64", "reached": "bool"}
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
    cov = summary.get("coverage") if isinstance(summary.get("coverage"), dict) else {}

    def cov_num(key: str) -> float:
        value = cov.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")

    kept = dict(summary)
    if cov and "data" in cov:  # the raw arcs go to coverage/<run_id>.parquet, not into every row
        kept["coverage"] = {k: v for k, v in cov.items() if k != "data"}
    return {"run_id": run_id, "command": command, "suite": str(summary.get("suite") or command),
            "created_utc": str(summary.get("created_utc", "")),
            "vllm_version": str(summary.get("vllm_version", "")),
            "device": str(summary.get("device", "")),
            "exit_status": int(summary.get("exit_status", 0) or 0),
            "steps": num("steps"), "steps_per_s": num("steps_per_s"), "examples": num("examples"),
            "shrink_runs": num("shrink_runs"),
            "examples_per_s": num("examples_per_s"), "mutants": num("mutants"),
            "detected": num("detected"), "elapsed_s": num("elapsed_s"),
            "vllm_share": float(share.get("vllm_share", float("nan"))),
            "classes": int(counts.get("classes", 0)), "new": int(counts.get("new", 0)),
            "known": int(counts.get("known", 0)), "expected": int(counts.get("expected", 0)),
            "report": str(summary.get("report", "")),
            "summary_json": json.dumps(kept, sort_keys=True, default=str),
            "coverage_lines_pct": cov_num("lines_pct"), "coverage_branches_pct": cov_num("branches_pct"),
            "coverage_unexplained": cov_num("unexplained_lines"),
            "memcheck": summary["memcheck"] if isinstance(summary.get("memcheck"), bool) else pd.NA}


def _typed(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(columns))
    return frame.astype(columns)


def _write_atomic(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    try:
        os.close(fd)
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_run(root: str | Path, summary: dict[str, Any], classes: pd.DataFrame | None) -> str:
    """Write one run (and its classes) into the store; returns the run id."""
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
    # classes (and coverage) first: a run row is only written once they are there
    classes_file = root / "classes" / f"{run_id}.parquet"
    _write_atomic(_typed(class_rows, CLASS_COLUMNS), classes_file)
    cov = summary.get("coverage") if isinstance(summary.get("coverage"), dict) else {}
    if cov.get("data"):
        _write_atomic(coverage_rows(cov["data"], run_id, run["vllm_version"]),
                      root / "coverage" / f"{run_id}.parquet")
    try:
        _write_atomic(_typed([run], RUN_COLUMNS), root / "runs" / f"{run_id}.parquet")
    except BaseException:
        classes_file.unlink(missing_ok=True)  # no run row: the classes would only be an orphan
        raise
    return run_id


def record_history(summary: dict[str, Any], classes: pd.DataFrame | None) -> None:
    """Append a finished run to the store ``history_dir()`` names. The run's result is
    already decided: a store that cannot be written, any error from it, or a Ctrl-C during
    the append costs one warning line on stderr, never the exit status."""
    root = None
    try:
        root = history_dir()
        if root is None:
            return
        append_run(root, summary, classes)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 -- see above
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else \
            " ".join(str(exc).split()) or type(exc).__name__
        where = root if root is not None else "the history store"
        print(f"simrig: warning: history not recorded in {where}: {why}", file=sys.stderr)


def coverage_rows(data: dict[str, Any], run_id: str, vllm_version: str) -> pd.DataFrame:
    """The branch arcs of the run's driven functions, reached or not (simrig coverage)."""
    branches = analyze(from_jsonable(data), Reasons([])).branches
    rows = branches.assign(run_id=run_id, vllm_version=vllm_version)
    return rows.reindex(columns=list(COVERAGE_COLUMNS)).astype(COVERAGE_COLUMNS)


def load_coverage(root: str | Path, runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's branch rows (runs with a coverage file and a run row only)."""
    listing = StoreListing()
    frame = _read_all(Path(root) / "coverage", COVERAGE_COLUMNS, listing)
    return frame[frame["run_id"].isin(set(runs["run_id"]))].reset_index(drop=True)


def never_reached_branches(coverage: pd.DataFrame) -> pd.DataFrame:
    """Per vLLM version: branch arcs (of functions some run drove) that no run reached,
    with how many runs saw the branch's function driven."""
    cols = ["vllm_version", "file", "function", "line", "to_line", "runs"]
    if coverage.empty:
        return pd.DataFrame(columns=cols)
    keys = ["vllm_version", "file", "function", "line", "to_line"]
    agg = coverage.groupby(keys, sort=True).agg(reached=("reached", "any"), runs=("run_id", "nunique"))
    never = agg[~agg["reached"]].reset_index()
    return never[cols]


def coverage_trend(runs: pd.DataFrame) -> pd.DataFrame:
    """Coverage per run that measured it, with the change against the previous
    measured run of the same suite; a drop in lines or branches reached is
    ``drop`` (shown like a new finding class)."""
    cols = ["run_id", "suite", "created_utc", "vllm_version", "lines_pct", "branches_pct",
            "unexplained", "change_lines", "change_branches", "verdict"]
    if runs.empty or "coverage_lines_pct" not in runs:
        return pd.DataFrame(columns=cols)
    measured = runs[runs["coverage_lines_pct"].notna()]
    rows, previous = [], {}
    for r in measured.itertuples(index=False):
        before = previous.get(r.suite)
        dl = r.coverage_lines_pct - before[0] if before else float("nan")
        db = r.coverage_branches_pct - before[1] if before else float("nan")
        verdict = ("first" if before is None else
                   "drop" if (dl < -1e-9 or db < -1e-9) else "same" if dl == 0 and db == 0 else "rise")
        rows.append({"run_id": r.run_id, "suite": r.suite, "created_utc": r.created_utc,
                     "vllm_version": r.vllm_version, "lines_pct": r.coverage_lines_pct,
                     "branches_pct": r.coverage_branches_pct, "unexplained": r.coverage_unexplained,
                     "change_lines": round(dl, 2), "change_branches": round(db, 2), "verdict": verdict})
        previous[r.suite] = (r.coverage_lines_pct, r.coverage_branches_pct)
    return pd.DataFrame(rows, columns=cols)


@dataclass
class StoreListing:
    """What a read of the store left out, and why (``simrig history --verbose``)."""

    temporary: list[Path] = field(default_factory=list)  # dot-files: an append in progress or killed
    unreadable: list[tuple[Path, str]] = field(default_factory=list)  # (file, why): skipped, warned
    orphans: list[Path] = field(default_factory=list)  # classes files with no run row


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _read_all(folder: Path, columns: dict[str, str], listing: StoreListing) -> pd.DataFrame:
    """Every complete file of one table; dot-files are listed as temporary, files
    that do not read as this table are skipped with a warning line on stderr."""
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    listing.temporary.extend(f for f in files if f.name.startswith("."))
    frames = []
    for path in (f for f in files if not f.name.startswith(".")):
        try:
            frame = pd.read_parquet(path)
            if "run_id" not in frame.columns:
                raise ValueError("no run_id column: not a history table")
            extra = [c for c in frame.columns if c not in columns]
            frame = frame.reindex(columns=[*columns, *extra]).astype(columns)
        except Exception as exc:  # noqa: BLE001 -- one bad file costs itself, never the store
            why = _one_line(exc)
            listing.unreadable.append((path, why))
            print(f"simrig: warning: history: skipped unreadable {path} ({why})", file=sys.stderr)
            continue
        if len(frame):
            frames.append(frame)
    if not frames:
        return _typed([], columns)
    return pd.concat(frames, ignore_index=True).astype(columns)


def load_history(root: str | Path, since: str | None = None,
                 listing: StoreListing | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, classes) sorted by time; ``since``: an ISO date/time, runs from then on.
    ``listing``, if given, is filled with the files left out (see StoreListing)."""
    root = Path(root)
    listing = listing if listing is not None else StoreListing()
    runs = _read_all(root / "runs", RUN_COLUMNS, listing)
    classes = _read_all(root / "classes", CLASS_COLUMNS, listing)
    run_ids = set(runs["run_id"])
    if (root / "classes").is_dir():
        listing.orphans.extend(f for f in sorted((root / "classes").glob("*.parquet"))
                               if not f.name.startswith(".") and f.stem not in run_ids)
    classes = classes[classes["run_id"].isin(run_ids)]  # a run row means complete
    if since:
        runs = runs[runs["created_utc"] >= since]
        classes = classes[classes["run_id"].isin(set(runs["run_id"]))]
    runs = runs.sort_values(["created_utc", "run_id"], kind="stable").reset_index(drop=True)
    return runs, classes.reset_index(drop=True)


def _summary(raw: Any) -> dict[str, Any]:
    try:
        out = json.loads(str(raw))
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _stages_shown(summary: dict[str, Any]) -> set[str] | None:
    """The stages a replay ran and could judge (None: not recorded)."""
    stages = summary.get("stages")
    if not isinstance(stages, list):
        return None
    off = {str(u.get("stage")) for u in summary.get("unavailable") or [] if isinstance(u, dict)}
    return {str(s) for s in stages} - off


def replays_all_of(later: dict[str, Any], earlier: dict[str, Any]) -> bool:
    """Whether run ``later`` (its summary) is a replay that ran to the end over at least
    what ``earlier`` ran (the stages it could judge, its PCP sizes): a class of
    ``earlier`` that ``later`` does not show is then *fixed*, not merely *not seen*.
    Fuzz and selftest runs never are: each run draws other examples."""
    if later.get("command") != "replay" or later.get("stopped_by"):
        return False
    if later.get("exit_status") in (EXIT_RIG_ERROR, EXIT_INTERRUPTED):
        return False  # a crashed or cut replay did not reach everything
    shown, before = _stages_shown(later), _stages_shown(earlier)
    if shown is not None and before is not None and not before <= shown:
        return False
    sizes, sizes_before = later.get("pcp_sizes"), earlier.get("pcp_sizes")
    return not (isinstance(sizes, list) and isinstance(sizes_before, list)
                and not set(sizes_before) <= set(sizes))


BISECT_FIELDS = ("introduced_in", "last_good", "fixed_in", "last_bad")


def bisect_results(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per finding class that ``simrig bisect`` located (the latest bisection of
    each wins): signature, class, mode, introduced_in / last_good, fixed_in / last_bad
    (release versions or commit hashes; "" for a leg not run), run id, time."""
    columns = ["signature", "class", "mode", *BISECT_FIELDS, "bisect_run", "bisected"]
    rows = []
    if len(runs):
        for r in runs[runs["command"] == "bisect"].itertuples(index=False):
            summary = _summary(r.summary_json)
            if summary.get("stopped_by") or not summary.get("signature"):
                continue
            rows.append({"signature": str(summary["signature"]), "class": str(summary.get("class", "")),
                         "mode": str(summary.get("mode", "")),
                         **{k: str(summary.get(k, "")) for k in BISECT_FIELDS},
                         "bisect_run": r.run_id, "bisected": r.created_utc})
    frame = pd.DataFrame(rows, columns=columns)
    return frame.drop_duplicates("signature", keep="last").reset_index(drop=True)


def _bisect_of(signature: str, found: pd.DataFrame) -> dict[str, str]:
    """The bisection of a class line: same (kind, stage, field), any exception type given."""
    for r in found.iloc[::-1].itertuples(index=False):
        if signature == r.signature or signature.startswith(r.signature + " · "):
            return {"introduced_in": r.introduced_in, "fixed_in": r.fixed_in}
    return {"introduced_in": "", "fixed_in": ""}


def class_timeline(runs: pd.DataFrame, classes: pd.DataFrame) -> pd.DataFrame:
    """One row per (suite, class signature): verdict (latest), runs seen, first/last
    seen, vLLM versions, ``fixed_since``: the first later run of the same suite that
    replays everything the last run showing it did, without it (see replays_all_of),
    and else ``not_seen_since``: the first later run of the suite without it
    (both "" while it still shows; ``*_run``: the run id). Still showing first,
    then not seen, then fixed."""
    columns = ["suite", "signature", "verdict", "runs_seen", "occurrences", "first_seen",
               "first_run", "last_seen", "last_run", "vllm_versions", "fixed_since",
               "fixed_since_run", "not_seen_since", "not_seen_since_run", "introduced_in", "fixed_in"]
    if runs.empty or classes.empty:
        return pd.DataFrame(columns=columns)
    order = {rid: i for i, rid in enumerate(runs["run_id"])}
    when = dict(zip(runs["run_id"], runs["created_utc"]))
    summaries = dict(zip(runs["run_id"], map(_summary, runs["summary_json"])))
    rows = []
    bisected = bisect_results(runs)
    for (suite, signature), group in classes.groupby(["suite", "signature"], sort=True):
        group = group.assign(_order=group["run_id"].map(order)).sort_values("_order")
        first, last = group.iloc[0], group.iloc[-1]
        later = runs[(runs["suite"] == suite)
                     & (runs["run_id"].map(order) > order[last["run_id"]])]["run_id"].tolist()
        fixed = [r for r in later if replays_all_of(summaries[r], summaries[last["run_id"]])]
        fixed_run = fixed[0] if fixed else ""
        unseen_run = later[0] if later and not fixed_run else ""
        rows.append({"suite": suite, "signature": signature, "verdict": last["verdict"],
                     "runs_seen": int(group["run_id"].nunique()),
                     "occurrences": int(group["occurrences"].sum()),
                     "first_seen": when[first["run_id"]], "first_run": first["run_id"],
                     "last_seen": when[last["run_id"]], "last_run": last["run_id"],
                     "vllm_versions": ",".join(sorted(set(group["vllm_version"].astype(str)))),
                     "fixed_since": when[fixed_run] if fixed_run else "", "fixed_since_run": fixed_run,
                     "not_seen_since": when[unseen_run] if unseen_run else "",
                     "not_seen_since_run": unseen_run, **_bisect_of(signature, bisected)})
    out = pd.DataFrame(rows, columns=columns)
    out["_rank"] = (out["fixed_since"] != "") * 2 + (out["not_seen_since"] != "")
    return out.sort_values(["_rank", "suite", "signature"]).drop(columns="_rank").reset_index(drop=True)


def run_trends(runs: pd.DataFrame, classes: pd.DataFrame) -> pd.DataFrame:
    """Per run: classes new / known / expected; classes of the previous run of the
    same suite that this one does not show: ``fixed`` when this run replays all the
    previous one did (replays_all_of), else ``not_seen``; steps/s, examples/s,
    mutants detected."""
    cols = ["run_id", "suite", "created_utc", "vllm_version", "exit_status", "new", "known",
            "expected", "fixed", "not_seen", "steps_per_s", "examples_per_s", "detected", "mutants"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    seen = {rid: set(g["signature"]) for rid, g in classes.groupby("run_id")}
    previous: dict[str, tuple[set[str], dict[str, Any]]] = {}
    fixed, not_seen = [], []
    for r in runs.itertuples(index=False):
        now, summary = seen.get(r.run_id, set()), _summary(r.summary_json)
        before, before_summary = previous.get(r.suite, (set(), {}))
        gone = len(before - now)
        proven = replays_all_of(summary, before_summary)
        fixed.append(gone if proven else 0)
        not_seen.append(0 if proven else gone)
        previous[r.suite] = (now, summary)
    return runs.assign(fixed=fixed, not_seen=not_seen)[cols]
