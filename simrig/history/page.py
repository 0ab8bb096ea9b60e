"""The ``simrig history`` page: trends per run and one line per finding class.

    ┌──────────────────────────────────────────────────────────────────┐
    │ banner: latest run per suite: new classes? exit status           │
    │ new classes the latest run of their suite still shows            │
    │ trends (one PNG, x = run date): classes new/known/expected per   │
    │   run, steps/s, examples/s, mutants detected, coverage (a panel  │
    │   only when some run measured it; one run: its number)          │
    │ ▸ classes: suite, signature, verdict, first seen, last seen,     │
    │   vLLM versions, fixed since <run> / not seen since <run>        │
    │ runs: one row per run (collapsed)                                │
    └──────────────────────────────────────────────────────────────────┘

Each suite on each vLLM release stands alone ("fuzz valid on vLLM 0.33.0"; --across-releases: not).
"""

from __future__ import annotations

import base64
import html
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.history.changes import across_releases
from simrig.history.store import StoreListing, bisect_results, class_timeline, coverage_trend, load_history, run_trends
from simrig.report.html import _CSS, emit_json, table

ON = " on vLLM "  # "fuzz valid on vLLM 0.33.0": a suite on one release, compared only with itself


def per_release(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs or classes with each suite named on its vLLM release, so every comparison of a
    run with the previous run of its suite (trends, class lines, coverage) stays on it."""
    if frame.empty:
        return frame
    release = frame["vllm_version"].astype(str).replace("", "?")
    return frame.assign(suite=frame["suite"].astype(str) + ON + release)


def _keyed(runs: pd.DataFrame, classes: pd.DataFrame, any_release: bool | None) -> tuple[Any, Any, bool]:
    """(runs, classes, any_release) as the page compares them (default: ``across_releases()``)."""
    any_release = across_releases() if any_release is None else any_release
    return (runs, classes, True) if any_release else (per_release(runs), per_release(classes), False)


def trends_png(trends: pd.DataFrame, runs: pd.DataFrame | None = None) -> bytes | None:
    """The panels over run dates (simrig.views.trends.history_trends): classes per run, and
    each rate any run measured; a series of one run is shown as its number."""
    from simrig.views.trends import history_trends  # lazy: views.trends brings matplotlib, needed only here

    if runs is not None and len(runs) == len(trends) and "coverage_lines_pct" in runs:
        trends = trends.assign(coverage_lines_pct=runs["coverage_lines_pct"].to_numpy())
    return history_trends(trends)


def render_history(runs: pd.DataFrame, classes: pd.DataFrame, since: str | None = None, *,
                   any_release: bool | None = None) -> str:
    """The page; ``any_release``: compare each run with the previous run of its suite on any
    vLLM release (default ``across_releases()``; else on its own release only)."""
    e = html.escape
    suites = runs["suite"].nunique() if len(runs) else 0
    releases = runs["vllm_version"].nunique() if len(runs) else 0
    runs, classes, any_release = _keyed(runs, classes, any_release)
    trends = run_trends(runs, classes)
    timeline = class_timeline(runs, classes)
    latest = runs.groupby("suite").tail(1) if len(runs) else runs
    failing = latest[latest["exit_status"] != 0] if len(latest) else latest
    fixed = int((timeline["fixed_since"] != "").sum()) if len(timeline) else 0
    unseen = int((timeline["not_seen_since"] != "").sum()) if len(timeline) else 0
    open_new = int((_showing(timeline) & (timeline["verdict"] == "new")).sum()) if len(timeline) else 0
    text = (f"{len(runs)} run(s) of {suites} suite(s) on {releases} vLLM release(s)"
            f"{' since ' + since if since else ''}: {open_new} new class(es) still showing, "
            f"{fixed} fixed, {unseen} not seen since; latest run failing in {len(failing)} suite(s)"
            + ("" if any_release else " (a suite on each release counted apart)"))
    scope = ("Each run is compared with the previous run of its suite on any vLLM release "
             "(--across-releases)." if any_release else
             "Each run is compared with the previous run of its suite on the same vLLM release: a "
             "suite on each release is a line of its own (--across-releases compares across them).")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>simrig history</title>"
             f"<style>{_CSS}</style></head><body><h1>simrig history</h1>",
             f"<p class='banner {'bad' if open_new or len(failing) else 'good'}'>{e(text)}</p>"]
    shown = _shown_timeline(timeline)
    if len(shown):
        failing = shown[(shown["verdict"] == "new") & (shown["status"] == "still showing")]
        parts.append(f"<h2>New classes still showing ({len(failing)})</h2>"
                     + (table(failing) if len(failing) else
                        "<p class='expected'>none: the latest run of every suite shows no new class</p>"))
    png = trends_png(trends, runs)
    if png is not None:
        parts.append(f"<h2>Trends</h2><p class='note'>{e(scope)}</p><img alt='trends' "
                     "src='data:image/png;base64," + base64.b64encode(png).decode("ascii") + "'>")
    parts.append("<h2>Finding classes</h2><p class='note'><b>fixed since</b> R: R replayed the same "
                 "traces (as much of them as the last run showing the class) and did not show it. "
                 "<b>not seen since</b> R: R only did not hit it (a fuzz or selftest run draws new "
                 "examples every time, so that proves nothing).</p><details><summary>"
                 f"{len(shown)} class line(s), one per suite and class</summary>"
                 + table(shown) + "</details>")
    bisected = bisect_results(runs)
    if len(bisected):
        parts.append("<h2>Introduced in (simrig bisect)</h2><p class='note'>where a bisection over "
                     "releases or commits found each class introduced (first bad; last good) and "
                     "fixed (first good; last bad)</p>"
                     + table(bisected.assign(bisected=bisected["bisected"].map(_short_time))))

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


def history_summary(runs: pd.DataFrame, classes: pd.DataFrame, *,
                    any_release: bool | None = None) -> dict[str, Any]:
    """``bisected``: where ``simrig bisect`` found each class introduced / fixed;
    ``fixed``: classes a later replay of the same traces no longer shows;
    ``not_seen``: classes a later run of their suite merely did not hit;
    ``still_new``: new classes the latest run of their suite still shows. Unless
    ``any_release``, "their suite" is the suite on the same vLLM release, and each
    item's ``suite`` reads "fuzz valid on vLLM 0.33.0"."""
    runs, classes, any_release = _keyed(runs, classes, any_release)
    timeline = class_timeline(runs, classes)
    cov = coverage_trend(runs)
    return {"runs": int(len(runs)), "classes": int(len(timeline)), "across_releases": any_release,
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


def history_command(store: Path, since: str | None, out: Path, *, verbose: bool, json_out: bool) -> int:
    """``simrig history`` from a checked store: the page written to ``out``, then its summary
    lines (or ``--json``); with ``verbose`` the files the reader skipped, on stderr. Runs are
    compared on their own vLLM release unless ``across_releases()`` (--across-releases)."""
    listing = StoreListing()
    runs, classes = load_history(store, since, listing)  # a bad file: a warning, skipped
    if verbose:
        for path in listing.temporary:
            print(f"history: ignored {path}: temporary (an append in progress, or one killed "
                  f"mid-write)", file=sys.stderr)
        for path, why in listing.unreadable:
            print(f"history: ignored {path}: unreadable ({why})", file=sys.stderr)
        for path in listing.orphans:
            print(f"history: ignored {path}: partial (classes with no run row: an append "
                  f"in progress, or one interrupted)", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_page(out, render_history(runs, classes, since))
    summary = {**history_summary(runs, classes), "page": str(out)}
    if json_out:
        emit_json(summary)
        return 0
    print(f"history: {summary['runs']} run(s), {summary['classes']} class line(s), "
          f"{len(summary['fixed'])} fixed, {len(summary['not_seen'])} not seen since, "
          f"{len(summary['still_new'])} new still showing")
    for item in summary["fixed"][:10]:
        print(f"  fixed since {item['fixed_since']} ({item['fixed_since_run']}): "
              f"[{item['suite']}] {item['signature']}")
    for item in summary["not_seen"][:10]:
        print(f"  not seen since {item['not_seen_since']} ({item['not_seen_since_run']}): "
              f"[{item['suite']}] {item['signature']}")
    for item in summary["still_new"][:10]:
        print(f"  NEW since {item['first_seen']}: [{item['suite']}] {item['signature']}")
    for item in summary["coverage_drops"][:10]:
        print(f"  COVERAGE DROP {item['created_utc']} ({item['run_id']}): [{item['suite']}] "
              f"lines {item['change_lines']:+.2f} pts, branches {item['change_branches']:+.2f} pts")
    print(f"page: {out}")
    return 0


def write_page(out: Path, text: str) -> None:
    """Write ``out`` through a temp file of its own, renamed into place: two
    ``simrig history`` at once each write whole pages, and a reader never sees half."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{out.name}-", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; the page is not
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
