"""Benchmark runs: run the pytest-benchmark suites, load saved runs, compare two.

    simrig bench            python -m pytest tests/bench --benchmark-enable ...
         |                      -> STORAGE/<machine>/NNNN_NAME.json  (--save NAME)
         v
    load_run(path)          one row per benchmark: name, group, min, median,
         |                  mean, stddev, rounds, extra_info   (seconds)
         v
    compare(A, B, pct)      B/A ratios for min and median, a bootstrap 95 % interval
         |                  of the median ratio from the runs' raw timings, a verdict
         |                  (faster / slower / within noise), status per row
    interleave(A, B, N)     the suites under two interpreters (two vLLMs) in rounds
         |                  A, B, A, B ...; per benchmark the paired bootstrap of the
         |                  per-round medians (simrig.compare.stats)
         |
         v
    markdown (terminal), CSV and HTML (bar chart of median ratios) under --out

A run is named by a file path, or by a saved run in the storage folder: its
name (``0003_base.json`` is ``base``; the highest number wins when a name was
saved more than once), its number (``3`` or ``0003``) or its full stem.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simrig.compare.stats import SLOWER
from simrig.errors import UsageError

SUITE = Path("tests") / "bench"
STAT_FIELDS = ("min", "median", "mean", "stddev", "rounds")
RUN_COLUMNS = ("name", "fullname", "group", *STAT_FIELDS, "extra_info", "data")
STATUS_REGRESSED, STATUS_OK = "regressed", "ok"
STATUS_ONLY_A, STATUS_ONLY_B = "only in A", "only in B"


# ------------------------------------------------------------------- running
def repo_root() -> Path | None:
    """The checkout holding tests/bench: the working directory, else the one
    this package was imported from (an editable install)."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (candidate / SUITE).is_dir():
            return candidate
    return None


def default_storage() -> Path:
    return (repo_root() or Path.cwd()) / ".benchmarks"


def pytest_command(*, filter_expr: str | None, save: str | None, storage: Path,
                   json_out: Path | None = None, python: str | None = None) -> list[str]:
    """The pytest invocation; ``-o addopts=`` drops the project's default
    ``--ignore=tests/bench --benchmark-disable`` so the suites run enabled.
    Raw timings are kept (``--benchmark-save-data``) so a comparison can give
    each ratio its uncertainty."""
    cmd = [python or sys.executable, "-m", "pytest", str(SUITE), "-o", "addopts=",
           "-p", "no:cacheprovider", "--benchmark-enable", "--benchmark-save-data",
           f"--benchmark-storage=file://{storage.resolve()}", "-q"]
    if filter_expr:
        cmd += ["-k", filter_expr]
    if save:
        cmd.append(f"--benchmark-save={save}")
    if json_out is not None:
        cmd.append(f"--benchmark-json={json_out}")
    return cmd


def run_suites(*, filter_expr: str | None, save: str | None, storage: Path) -> tuple[int, pd.DataFrame | None]:
    """Run the suites in a subprocess; (pytest's exit status, the run's frame)."""
    root = repo_root()
    if root is None:
        raise UsageError(f"{SUITE}: not found in the working directory or the simrig checkout")
    if save is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", save):
        raise UsageError(f"--save {save!r}: use letters, digits, '_', '-', '.' only")
    storage.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="simrig-bench-", suffix=".json")
    os.close(fd)
    try:
        cmd = pytest_command(filter_expr=filter_expr, save=save, storage=storage,
                             json_out=Path(tmp))
        status = subprocess.call(cmd, cwd=root)
        if status == 5:  # pytest: no tests collected
            raise UsageError(f"--filter {filter_expr!r}: selects no benchmark in {SUITE}")
        frame = load_run(tmp) if os.path.getsize(tmp) else None
        return status, frame
    finally:
        os.unlink(tmp)


# ------------------------------------------------------------------- loading
def _counter(path: Path) -> int:
    head = path.stem.split("_", 1)[0]
    return int(head) if head.isdigit() else -1


def resolve_run(ref: str, storage: Path) -> Path:
    """A run reference (file path, saved name, number or stem) -> its JSON file."""
    as_path = Path(ref)
    if as_path.is_file():
        return as_path
    saved = sorted(storage.rglob("*.json")) if storage.is_dir() else []
    exact = [p for p in saved if p.stem == ref]
    if ref.isdigit():
        exact += [p for p in saved if _counter(p) == int(ref) and p not in exact]
    if len(exact) == 1:
        return exact[0]
    if len(exact) > 1:
        names = ", ".join(str(p) for p in exact)
        raise UsageError(f"run {ref!r}: ambiguous in {storage}: {names}")
    named = [p for p in saved if "_" in p.stem and p.stem.split("_", 1)[1] == ref]
    if named:
        return max(named, key=lambda p: (_counter(p), p.stat().st_mtime))
    raise UsageError(f"run {ref!r}: no such file, and no saved run of that name or "
                     f"number in {storage}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_run(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One saved pytest-benchmark run -> one row per benchmark (times in seconds)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text (not a pytest-benchmark JSON run)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: JSON: {exc.msg}") from None
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list):
        raise UsageError(f"{path}: benchmarks: missing (not a pytest-benchmark JSON run)")
    if not benchmarks:
        raise UsageError(f"{path}: benchmarks: empty (was the run made with --benchmark-disable?)")
    rows = []
    for i, bench in enumerate(benchmarks):
        where = f"{path}: benchmarks[{i}]"
        if not isinstance(bench, dict) or not isinstance(bench.get("name"), str):
            raise UsageError(f"{where}.name: missing or not a string")
        stats = bench.get("stats")
        if not isinstance(stats, dict):
            raise UsageError(f"{where}.stats: missing")
        for key in STAT_FIELDS:
            if not _number(stats.get(key)):
                raise UsageError(f"{where}.stats.{key}: missing or not a number")
        extra = bench.get("extra_info") or {}
        if not isinstance(extra, dict):
            raise UsageError(f"{where}.extra_info: not an object")
        data = stats.get("data")
        raw = [float(x) for x in data] if isinstance(data, list) and all(map(_number, data)) else []
        rows.append({"name": bench["name"], "fullname": str(bench.get("fullname") or bench["name"]),
                     "group": bench.get("group") or "", **{k: stats[k] for k in STAT_FIELDS},
                     "extra_info": extra, "data": raw})
    frame = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    dupes = frame["fullname"][frame["fullname"].duplicated()]
    if len(dupes):
        raise UsageError(f"{path}: benchmarks: {dupes.iloc[0]!r} appears more than once")
    frame.attrs["path"] = str(path)
    return frame


# ----------------------------------------------------------------- comparing
def compare(a: pd.DataFrame, b: pd.DataFrame, fail_pct: float | None = None) -> pd.DataFrame:
    """B/A ratios per benchmark (matched by full name), worst median ratio first.

    status: "regressed" when median B/A > 1 + fail_pct/100 (never without
    fail_pct), "ok" otherwise, "only in A" / "only in B" when unmatched.
    """
    if fail_pct is not None and (not math.isfinite(fail_pct) or fail_pct < 0):
        raise UsageError(f"--fail-on-regression {fail_pct}: must be a percentage >= 0")
    cols = ["fullname", "name", "group", "min", "median", "data"]
    a, b = (f if "data" in f.columns else f.assign(data=[[] for _ in range(len(f))]) for f in (a, b))
    merged = a[cols].merge(b[cols], on="fullname", how="outer", suffixes=("_a", "_b"),
                           indicator=True)
    merged["name"] = merged["name_a"].fillna(merged["name_b"])
    merged["group"] = merged["group_a"].fillna(merged["group_b"])
    merged["min_ratio"] = merged["min_b"] / merged["min_a"]
    merged["median_ratio"] = merged["median_b"] / merged["median_a"]
    limit = math.inf if fail_pct is None else 1 + fail_pct / 100
    status = pd.Series(STATUS_OK, index=merged.index, dtype=object)
    status[merged["median_ratio"] > limit] = STATUS_REGRESSED
    status[merged["_merge"] == "left_only"] = STATUS_ONLY_A
    status[merged["_merge"] == "right_only"] = STATUS_ONLY_B
    merged["ci_low"], merged["ci_high"], merged["verdict"] = zip(*(
        median_ratio_ci(x, y) for x, y in zip(merged["data_a"], merged["data_b"]))) \
        if len(merged) else ((), (), ())
    # A ratio inside the noise is never a regression, however large it looks.
    status[(merged["verdict"] != NO_RAW) & (merged["verdict"] != SLOWER)
           & (status == STATUS_REGRESSED)] = STATUS_OK
    merged["status"] = status
    out = merged[["name", "group", "min_a", "min_b", "min_ratio", "median_a", "median_b",
                  "median_ratio", "ci_low", "ci_high", "verdict", "status", "fullname"]]
    out = out.sort_values(["median_ratio", "fullname"], ascending=[False, True],
                          na_position="last", kind="stable").reset_index(drop=True)
    out.attrs.update(a_path=a.attrs.get("path", "A"), b_path=b.attrs.get("path", "B"),
                     fail_pct=fail_pct)
    return out


NO_RAW = "no raw timings"


def median_ratio_ci(a: Any, b: Any, resamples: int = 2000, seed: int = 0
                    ) -> tuple[float, float, str]:
    """95 % bootstrap interval of median(B)/median(A) from two runs' raw timings
    (resampled independently: saved runs are not paired) and its verdict."""
    from simrig.compare.stats import MIN_ROUNDS, verdict

    if not isinstance(a, list) or not isinstance(b, list) or min(len(a), len(b)) < MIN_ROUNDS:
        return math.nan, math.nan, NO_RAW
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a), np.asarray(b)
    med_a = np.median(xa[rng.integers(0, len(xa), (resamples, len(xa)))], axis=1)
    med_b = np.median(xb[rng.integers(0, len(xb), (resamples, len(xb)))], axis=1)
    low, high = np.percentile(med_b / med_a, [2.5, 97.5])
    return float(low), float(high), verdict(float(low), float(high))


def interleave(python_a: str, python_b: str, rounds: int, *, filter_expr: str | None,
               log: Any = print) -> pd.DataFrame:
    """Run the suites under two interpreters in rounds A, B, A, B ... (the same
    time window, so both see the same load) and compare per-round medians."""
    root = repo_root()
    if root is None:
        raise UsageError(f"{SUITE}: not found in the working directory or the simrig checkout")
    if rounds < 1:
        raise UsageError(f"--rounds: must be >= 1, got {rounds}")
    per_round: dict[str, list[pd.DataFrame]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(prefix="simrig-bench-interleave-") as tmp:
        for k in range(rounds):
            for side, python in (("a", python_a), ("b", python_b)):
                out = Path(tmp) / f"{side}{k}.json"
                cmd = pytest_command(filter_expr=filter_expr, save=None, storage=Path(tmp) / "s",
                                     json_out=out, python=python)
                status = subprocess.call(cmd, cwd=root, stdout=subprocess.DEVNULL)
                if status not in (0, 1) or not out.is_file() or not out.stat().st_size:
                    raise UsageError(f"--interleave: the suites did not run under {python} "
                                     f"(pytest exit {status})")
                per_round[side].append(load_run(out))
            log(f"bench: round {k + 1}/{rounds} done")
    return interleaved_table(per_round["a"], per_round["b"])


def interleaved_table(rounds_a: list[pd.DataFrame], rounds_b: list[pd.DataFrame]) -> pd.DataFrame:
    """Per benchmark: mean of per-round medians on each side, paired bootstrap ratio B/A."""
    from simrig.compare.stats import bootstrap_ratio

    def medians(frames: list[pd.DataFrame]) -> pd.DataFrame:
        return pd.concat([f.set_index("fullname")["median"].rename(i) for i, f in enumerate(frames)],
                         axis=1)

    ma, mb = medians(rounds_a), medians(rounds_b)
    rows = []
    for name in sorted(set(ma.index) & set(mb.index)):
        a, b = ma.loc[name].to_numpy(float), mb.loc[name].to_numpy(float)
        r = bootstrap_ratio(a, b)
        rows.append({"fullname": name, "median_a": float(np.mean(a)), "median_b": float(np.mean(b)),
                     "median_ratio": r.ratio, "ci_low": r.low, "ci_high": r.high,
                     "rounds": r.rounds, "verdict": r.verdict})
    return pd.DataFrame(rows, columns=["fullname", "median_a", "median_b", "median_ratio", "ci_low",
                                       "ci_high", "rounds", "verdict"])


def regressions(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["status"] == STATUS_REGRESSED]


# ---------------------------------------------------------------- rendering
def format_seconds(value: float) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _ratio(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _display(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "benchmark": table["name"], "group": table["group"],
        "median A": table["median_a"].map(format_seconds),
        "median B": table["median_b"].map(format_seconds),
        "B/A median": table["median_ratio"].map(_ratio),
        "B/A min": table["min_ratio"].map(_ratio),
        "95% CI": [f"[{_ratio(lo)}, {_ratio(hi)}]" if math.isfinite(lo) else "-"
                   for lo, hi in zip(table["ci_low"], table["ci_high"])]
        if "ci_low" in table.columns else "-",
        "verdict": table["verdict"] if "verdict" in table.columns else "-",
        "status": table["status"]})


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of any frame's values as strings."""
    cols = [str(c) for c in frame.columns]
    cells = [[str(v).replace("|", "\\|") for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def compare_markdown(table: pd.DataFrame) -> str:
    return markdown_table(_display(table))


def run_markdown(frame: pd.DataFrame) -> str:
    """One run as a table: benchmark, group, median, min, rounds."""
    shown = frame.sort_values(["group", "name"], kind="stable")
    return markdown_table(pd.DataFrame({
        "benchmark": shown["name"], "group": shown["group"],
        "median": shown["median"].map(format_seconds), "min": shown["min"].map(format_seconds),
        "rounds": shown["rounds"].astype(int)}))


def extra_markdown(frame: pd.DataFrame) -> str:
    """Per-stage medians and overhead figures the real-code benchmarks keep in
    extra_info (``<stage>_median_ms``, ``overhead_ratio``,
    ``outside_stages_share``); "" when none."""
    found = {k for info in frame["extra_info"] for k in info
             if k.endswith("_median_ms") or k in ("overhead_ratio", "outside_stages_share")}
    first = [f"{s}_median_ms" for s in ("gather", "prepare", "dummy", "partition", "bare",
                                        "harness")] + ["overhead_ratio", "outside_stages_share"]
    keys = [k for k in first if k in found] + sorted(found - set(first))
    rows = frame[[any(k in info for k in keys) for info in frame["extra_info"]]]
    if rows.empty:
        return ""
    table = pd.DataFrame({"benchmark": rows["name"]})
    for key in keys:
        table[key] = [("-" if info.get(key) is None else f"{info[key]:.4g}")
                      if key in info else "" for info in rows["extra_info"]]
    return markdown_table(table)


def ratio_chart_png(table: pd.DataFrame) -> bytes:
    """Horizontal bars of median B/A per matched benchmark (red: regressed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    shown = table.dropna(subset=["median_ratio"]).iloc[::-1]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.28 * max(len(shown), 1)))
    try:
        colors = ["#c0392b" if s == STATUS_REGRESSED else "#2e86c1" for s in shown["status"]]
        ax.barh(range(len(shown)), shown["median_ratio"], color=colors)
        ax.set_yticks(range(len(shown)), shown["name"], fontsize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        fail_pct = table.attrs.get("fail_pct")
        if fail_pct is not None:
            ax.axvline(1 + fail_pct / 100, color="#c0392b", linestyle="--", linewidth=0.8)
        ax.set_xlabel("median time, B / A (> 1: B is slower)")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()
    finally:
        plt.close(fig)


def compare_html(table: pd.DataFrame) -> str:
    png = base64.b64encode(ratio_chart_png(table)).decode("ascii")
    a, b = (html.escape(table.attrs.get(k, "")) for k in ("a_path", "b_path"))
    fail_pct = table.attrs.get("fail_pct")
    limit = "none" if fail_pct is None else f"median B/A &gt; {1 + fail_pct / 100:.3f}"
    n_bad = len(regressions(table))
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        "<title>simrig bench: B vs A</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style></head><body>\n"
        f"<h1>simrig bench: B vs A</h1>\n<p>A: <code>{a}</code><br>B: <code>{b}</code><br>"
        f"regression limit: {limit}; regressed: {n_bad} of {len(table)}</p>\n"
        f"<img alt='median ratio B/A per benchmark' src='data:image/png;base64,{png}'>\n"
        f"{_display(table).to_html(index=False, escape=True)}\n</body></html>\n")


def _label(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(path).stem) or "run"


def write_compare(table: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """CSV (raw seconds and ratios) and HTML, both or neither (atomic renames)."""
    stem = f"compare_{_label(table.attrs.get('a_path', 'A'))}_vs_{_label(table.attrs.get('b_path', 'B'))}"
    contents = {"csv": table.to_csv(index=False), "html": compare_html(table)}
    out_dir.mkdir(parents=True, exist_ok=True)
    staged: dict[str, tuple[str, Path]] = {}
    try:
        for ext, text in contents.items():
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{stem}.", suffix=f".{ext}.tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; reports are shared
            staged[ext] = (tmp, out_dir / f"{stem}.{ext}")
        for tmp, final in staged.values():
            os.replace(tmp, final)
    finally:
        for tmp, _ in staged.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
    return {ext: final for ext, (_, final) in staged.items()}
