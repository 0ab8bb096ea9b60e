"""The ``simrig history`` page: trends per run and one line per finding class.

    ┌──────────────────────────────────────────────────────────────────┐
    │ banner: latest run per suite: new classes? exit status           │
    │ trends (one PNG): classes new/known/expected/fixed/not seen per  │
    │                   run, steps/s, examples/s, mutants detected     │
    │ classes: suite, signature, verdict, first seen, last seen,       │
    │          vLLM versions, fixed since <run> / not seen since <run> │
    │ runs: one row per run (collapsed)                                │
    └──────────────────────────────────────────────────────────────────┘
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import pandas as pd

from simrig.history.store import bisect_results, class_timeline, run_trends
from simrig.report.html import _CSS, table


def trends_png(trends: pd.DataFrame) -> bytes | None:
    """Four small panels over runs (x = run number in time order)."""
    if trends.empty:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 5.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    x = range(len(trends))
    ax = axes[0][0]
    bottom = [0] * len(trends)
    for col, color in (("new", "#c0392b"), ("known", "#999999"), ("expected", "#2e8b57")):
        values = trends[col].astype(float).tolist()
        ax.bar(x, values, bottom=bottom, color=color, label=col)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(list(x), trends["fixed"].astype(float), "kv", label="fixed since previous run (replay)")
    ax.plot(list(x), trends["not_seen"].astype(float), "v", color="#888888", markerfacecolor="none",
            label="not seen since previous run")
    ax.set_title("finding classes per run", fontsize=9, loc="left")
    ax.legend(fontsize=7)
    for ax, col, title in ((axes[0][1], "steps_per_s", "steps/s (replay, fuzz)"),
                           (axes[1][0], "examples_per_s", "examples/s (fuzz)"),
                           (axes[1][1], "detected", "mutants detected (selftest)")):
        values = trends[col].astype(float)
        for suite, group in trends.assign(_x=list(x)).groupby("suite"):
            v = group[col].astype(float)
            if v.notna().any():
                ax.plot(group["_x"], v, "o-", label=str(suite)[:40], markersize=4)
        ax.set_title(title, fontsize=9, loc="left")
        if values.notna().any():
            ax.legend(fontsize=6)
    for ax in (a for row in axes for a in row):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not ax.lines and not ax.patches:
            ax.text(0.5, 0.5, "no runs of this kind yet", ha="center", va="center",
                    transform=ax.transAxes, color="#888")
            ax.set_xticks([])
            ax.set_yticks([])
    for ax in axes[1]:
        ax.set_xlabel("run (oldest → newest)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, metadata={"Software": None})
    return buf.getvalue()


def render_history(runs: pd.DataFrame, classes: pd.DataFrame, since: str | None = None) -> str:
    e = html.escape
    trends = run_trends(runs, classes)
    timeline = class_timeline(runs, classes)
    latest = runs.groupby("suite").tail(1) if len(runs) else runs
    failing = latest[latest["exit_status"] != 0] if len(latest) else latest
    fixed = int((timeline["fixed_since"] != "").sum()) if len(timeline) else 0
    unseen = int((timeline["not_seen_since"] != "").sum()) if len(timeline) else 0
    open_new = int((_showing(timeline) & (timeline["verdict"] == "new")).sum()) if len(timeline) else 0
    text = (f"{len(runs)} run(s) of {runs['suite'].nunique() if len(runs) else 0} suite(s)"
            f"{' since ' + since if since else ''}: {open_new} new class(es) still showing, "
            f"{fixed} fixed, {unseen} not seen since; latest run failing in {len(failing)} suite(s)")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>simrig history</title>"
             f"<style>{_CSS}</style></head><body><h1>simrig history</h1>",
             f"<p class='banner {'bad' if open_new or len(failing) else 'good'}'>{e(text)}</p>"]
    png = trends_png(trends)
    if png is not None:
        parts.append("<h2>Trends</h2><img alt='trends' src='data:image/png;base64,"
                     + base64.b64encode(png).decode("ascii") + "'>")
    parts.append("<h2>Finding classes</h2><p class='note'><b>fixed since</b> R: R replayed the same "
                 "traces (as much of them as the last run showing the class) and did not show it. "
                 "<b>not seen since</b> R: R only did not hit it (a fuzz or selftest run draws new "
                 "examples every time, so that proves nothing).</p>" + table(_shown_timeline(timeline)))
    bisected = bisect_results(runs)
    if len(bisected):
        parts.append("<h2>Introduced in (simrig bisect)</h2><p class='note'>where a bisection over "
                     "releases or commits found each class introduced (first bad; last good) and "
                     "fixed (first good; last bad)</p>"
                     + table(bisected.assign(bisected=bisected["bisected"].map(_short_time))))
    from simrig.history.store import coverage_trend

    cov = coverage_trend(runs)
    if len(cov):
        drops = int((cov["verdict"] == "drop").sum())
        shown = cov.assign(verdict=cov["verdict"].map(lambda v: "new" if v == "drop" else v),
                           created_utc=cov["created_utc"].map(_short_time))
        parts.append("<h2>Coverage of the MRV2 code over time</h2>"
                     f"<p class='banner {'bad' if drops else 'good'}'>{drops} coverage drop(s): a run "
                     "that reached fewer lines or branches than the previous measured run of its "
                     "suite (verdict <b>new</b> = drop)</p>" + table(shown))
    parts.append("<h2>Runs</h2><details open><summary>one row per run</summary>"
                 + table(trends.assign(created_utc=trends["created_utc"].map(_short_time)))
                 + "</details>")
    parts.append("<p class='note'>Data: runs/ and classes/ parquet datasets next to this page "
                 "(pd.read_parquet on the folder).</p></body></html>")
    return "\n".join(parts)


def _short_time(iso: str) -> str:
    """'2026-12-01T07:41:00+00:00' -> '2026-12-01 07:41' (all times are UTC)."""
    return str(iso)[:16].replace("T", " ")


def _showing(timeline: pd.DataFrame) -> pd.Series:
    """Class lines the latest run of their suite still shows."""
    return (timeline["fixed_since"] == "") & (timeline["not_seen_since"] == "")


def _shown_timeline(timeline: pd.DataFrame) -> pd.DataFrame:
    """The class lines as a person reads them (run ids stay in the data)."""
    if timeline.empty:
        return timeline
    status = [f"fixed since {_short_time(f)} ({fr})" if f else
              f"not seen since {_short_time(n)} ({nr})" if n else "still showing"
              for f, fr, n, nr in zip(timeline["fixed_since"], timeline["fixed_since_run"],
                                      timeline["not_seen_since"], timeline["not_seen_since_run"])]
    introduced = [(f"{i}" if i else "") + (f"; fixed in {x}" if x else "")
                  for i, x in zip(timeline["introduced_in"], timeline["fixed_in"])]
    shown = timeline.assign(
        first_seen=timeline["first_seen"].map(_short_time),
        last_seen=timeline["last_seen"].map(_short_time), status=status, introduced_in=introduced)
    return shown[["suite", "signature", "verdict", "runs_seen", "occurrences", "first_seen",
                  "last_seen", "vllm_versions", "introduced_in", "status"]]


def history_summary(runs: pd.DataFrame, classes: pd.DataFrame) -> dict[str, Any]:
    """``bisected``: where ``simrig bisect`` found each class introduced / fixed;
    ``fixed``: classes a later replay of the same traces no longer shows;
    ``not_seen``: classes a later run of their suite merely did not hit;
    ``still_new``: new classes the latest run of their suite still shows."""
    from simrig.history.store import coverage_trend

    timeline = class_timeline(runs, classes)
    cov = coverage_trend(runs)
    return {"runs": int(len(runs)), "classes": int(len(timeline)),
            "coverage": cov.to_dict("records"),
            "coverage_drops": cov[cov["verdict"] == "drop"][
                ["suite", "run_id", "created_utc", "change_lines", "change_branches"]].to_dict("records"),
            "bisected": bisect_results(runs).to_dict("records"),
            "fixed": timeline[timeline["fixed_since"] != ""][["suite", "signature", "fixed_since",
                                                              "fixed_since_run"]].to_dict("records"),
            "not_seen": timeline[timeline["not_seen_since"] != ""][
                ["suite", "signature", "not_seen_since", "not_seen_since_run"]].to_dict("records"),
            "still_new": timeline[_showing(timeline) & (timeline["verdict"] == "new")]
            [["suite", "signature", "first_seen"]].to_dict("records")}
