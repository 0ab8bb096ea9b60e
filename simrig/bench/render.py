"""Rendering benchmark runs and comparisons: markdown tables for the terminal,
CSV and HTML (a bar chart of the median ratios with their intervals) on disk.

    run_markdown(run)        benchmark, group, median, min, rounds
    extra_markdown(run)      stage medians / overhead figures from extra_info
    compare_markdown(table)  one row per benchmark of simrig.bench.saves.compare
    compare_notes(table)     how the verdicts were reached, what to do when they can't be
    write_compare(table)     compare_<A>_vs_<B>.csv and .html, both or neither
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import re
import tempfile
from pathlib import Path

import pandas as pd

from simrig.bench.saves import (
    CANNOT_TELL,
    FASTER,
    SLOWER,
    STATUS_REGRESSED,
    STATUS_UNVERIFIED,
    regressions,
    unverified,
)

INTERLEAVE_HINT = ("Saved runs made at different times do not share the machine's load. Where a "
                   "verdict matters and A and B are two vLLMs, `simrig bench --interleave A B` "
                   "runs both in alternating rounds in one time window; otherwise save the sides "
                   "alternately (A, B, A, B, ...).")


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
        "saves A/B": [f"{a}/{b}" for a, b in zip(table["saves_a"], table["saves_b"])],
        "median A": table["median_a"].map(format_seconds),
        "median B": table["median_b"].map(format_seconds),
        "B/A median": table["median_ratio"].map(_ratio),
        "B/A min": table["min_ratio"].map(_ratio),
        "interval": [f"[{_ratio(lo)}, {_ratio(hi)}]" if math.isfinite(lo) else "-"
                     for lo, hi in zip(table["ci_low"], table["ci_high"])],
        "verdict": table["verdict"], "status": table["status"]})


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of any frame's values as strings."""
    cols = [str(c) for c in frame.columns]
    cells = [[str(v).replace("|", "\\|") for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def compare_markdown(table: pd.DataFrame) -> str:
    return markdown_table(_display(table))


def compare_notes(table: pd.DataFrame) -> list[str]:
    """Plain-text lines under the table: the rule behind the verdicts, the
    counts, and what to do when a side has one save."""
    effect = table.attrs.get("min_effect", 0.05)
    judged = table.attrs.get("judged", 0)
    counts = table["verdict"].value_counts()
    tally = ", ".join(f"{counts[v]} {v}" for v in (SLOWER, FASTER, "within noise", CANNOT_TELL)
                      if v in counts)
    family = 100 * (1 - table.attrs.get("family_alpha", 0.05))
    per_row = (f"family-wise {family:g}% over the {judged} rows judged, so "
               f"{100 * table.attrs.get('level', 0.95):.4g}% per row" if judged
               else f"family-wise {family:g}%")
    notes = [f"verdicts: {tally or 'none'}.",
             (f"verdict rule: needs 2 or more saves per side; the interval comes from the spread "
              f"of the median between the saves of each side (t interval on log medians, "
              f"{per_row}). 'slower' needs it above {1 + effect:.3g}, 'faster' below "
              f"{1 / (1 + effect):.3g} (a {effect * 100:g}% minimum effect); anything else is "
              f"'within noise'.")]
    if CANNOT_TELL in counts:
        notes.append(f"cannot tell: {counts[CANNOT_TELL]} row(s) have a single save on a side. The "
                     "rounds inside one run share its load, so they say nothing about run-to-run "
                     "noise (two saves of identical code can differ 2x). Save each side 3 or more "
                     "times and compare the sets: --compare A1,A2,A3 B1,B2,B3, or by pattern: "
                     "--compare 'base*' 'change*'.")
    notes.append(INTERLEAVE_HINT)
    return notes


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
    """Horizontal bars of median B/A per matched benchmark with the interval as
    an error bar where there is one (red: regressed, orange: over the limit
    but one save per side)."""
    import matplotlib  # lazy: matplotlib loads only when this runs

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # lazy: matplotlib loads only when this runs

    shown = table.dropna(subset=["median_ratio"]).iloc[::-1]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.28 * max(len(shown), 1)))
    try:
        colors = ["#c0392b" if s == STATUS_REGRESSED else "#e67e22" if s == STATUS_UNVERIFIED
                  else "#2e86c1" for s in shown["status"]]
        ratio = shown["median_ratio"].to_numpy(float)
        low = (ratio - shown["ci_low"].to_numpy(float)).clip(min=0)
        high = (shown["ci_high"].to_numpy(float) - ratio).clip(min=0)
        ax.barh(range(len(shown)), ratio, color=colors,
                xerr=[[0 if math.isnan(v) else v for v in low], [0 if math.isnan(v) else v for v in high]],
                error_kw={"linewidth": 0.8})
        ax.set_yticks(range(len(shown)), shown["name"], fontsize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        fail_pct = table.attrs.get("fail_pct")
        if fail_pct is not None:
            ax.axvline(1 + fail_pct / 100, color="#c0392b", linestyle="--", linewidth=0.8)
        ax.set_xlabel("median time, B / A (> 1: B is slower); bars: interval between saves")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()
    finally:
        plt.close(fig)


def _paths(table: pd.DataFrame, side: str) -> str:
    paths = table.attrs.get(f"{side}_paths") or [table.attrs.get(f"{side}_path", side.upper())]
    return "<br>".join(f"<code>{html.escape(str(p))}</code>" for p in paths)


def compare_html(table: pd.DataFrame) -> str:
    png = base64.b64encode(ratio_chart_png(table)).decode("ascii")
    fail_pct = table.attrs.get("fail_pct")
    limit = "none" if fail_pct is None else f"median B/A &gt; {1 + fail_pct / 100:.3f}"
    n_bad, n_unverified = len(regressions(table)), len(unverified(table))
    notes = "".join(f"<p>{html.escape(line)}</p>\n" for line in compare_notes(table))
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        "<title>simrig bench: B vs A</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style></head><body>\n"
        f"<h1>simrig bench: B vs A</h1>\n<p>A:<br>{_paths(table, 'a')}</p>\n"
        f"<p>B:<br>{_paths(table, 'b')}</p>\n"
        f"<p>regression limit: {limit}; regressed: {n_bad} of {len(table)}; over the limit but "
        f"cannot tell: {n_unverified}</p>\n{notes}"
        f"<img alt='median ratio B/A per benchmark' src='data:image/png;base64,{png}'>\n"
        f"{_display(table).to_html(index=False, escape=True)}\n</body></html>\n")


def _label(table: pd.DataFrame, side: str) -> str:
    paths = table.attrs.get(f"{side}_paths") or [table.attrs.get(f"{side}_path", side.upper())]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(str(paths[0])).stem) or "run"
    return label if len(paths) == 1 else f"{label}+{len(paths) - 1}"


def write_compare(table: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    """CSV (raw seconds, ratios, intervals, verdicts) and HTML, both or neither
    (atomic renames). A side of several saves is named by its first save and
    ``+N`` more."""
    stem = f"compare_{_label(table, 'a')}_vs_{_label(table, 'b')}"
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
