"""Curves over time with one look in every report: a campaign's coverage and classes over
its seconds, the history page's rates and classes over run dates.

matplotlib (Agg, plain ``Figure`` objects) draws them to PNG bytes inlined into the page, so
every report stays one offline file. The look is set here once (``new_axes``): the same
size, fonts, grid and verdict colours everywhere. A series of one point is not a plot: the
panel shows the number, large, and the date it is from.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

VERDICT_COLOURS = {"new": "#c0392b", "known": "#999999", "expected": "#2e8b57"}
SERIES_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#8172B3", "#937860", "#DA8BC3")
PANEL_SIZE = (4.6, 2.6)  # inches per panel (at 90 dpi: about 410 x 235 px)
DPI = 90


def new_axes(panels: int, columns: int = 2) -> tuple[Figure, list[Any]]:
    """A figure of ``panels`` panels, ``columns`` to a row, in the one look."""
    columns = max(1, min(columns, panels))
    rows = -(-panels // columns)
    fig = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    for ax in axes[:panels]:
        style(ax)
    return fig, axes[:panels]


def style(ax: Any) -> None:
    ax.grid(True, color="#e6e6e6", linewidth=0.7)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8)


def title(ax: Any, text: str) -> None:
    ax.set_title(text, fontsize=9, loc="left")


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # no timestamp or software metadata: the same data gives the same bytes
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def single_value(ax: Any, value: float, unit: str, when: str) -> None:
    """A series of one point: the number itself, and where it is from."""
    ax.grid(False)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.text(0.5, 0.55, f"{value:,.2f}".rstrip("0").rstrip(".") + (f" {unit}" if unit else ""),
            ha="center", va="center", fontsize=22, transform=ax.transAxes)
    ax.text(0.5, 0.22, f"one run so far ({when})", ha="center", va="center", fontsize=8,
            color="#666", transform=ax.transAxes)


def _shared_range(ax: Any, when: pd.Series) -> None:
    """Every dated panel spans all runs' dates, so panels line up under each other."""
    when = when.dropna()
    if len(when) > 1:
        # at least a minute either side: runs seconds apart still get readable ticks
        pad = max((when.max() - when.min()) * 0.04, pd.Timedelta(minutes=1))
        ax.set_xlim(when.min() - pad, when.max() + pad)


def _single_values(ax: Any, values: dict[str, float], unit: str) -> None:
    """One run of each of several suites: a number per suite, no plot."""
    ax.grid(False)
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    step = 0.8 / max(len(values), 1)
    for i, (label, value) in enumerate(values.items()):
        y = 0.85 - i * step
        ax.text(0.02, y, f"{value:,.2f}".rstrip("0").rstrip(".") + (f" {unit}" if unit else ""),
                fontsize=15, va="center", transform=ax.transAxes)
        ax.text(0.02, y - step * 0.38, f"{_short(label, 60)} (one run so far)", fontsize=7, color="#666",
                va="center", transform=ax.transAxes)


def dated_series(ax: Any, times: pd.Series, values: dict[str, pd.Series], unit: str = "") -> None:
    """Lines over run dates, one per label; a label with a single run overall is a number."""
    when = pd.to_datetime(times, utc=True, errors="coerce")
    points = {label: (when[v.notna()], v[v.notna()].astype(float)) for label, v in values.items()}
    points = {k: p for k, p in points.items() if len(p[1])}
    if len(points) == 1 and len(next(iter(points.values()))[1]) == 1:
        (t, v), = points.values()
        single_value(ax, float(v.iloc[0]), unit, t.iloc[0].strftime("%Y-%m-%d %H:%M UTC"))
        return
    if points and all(len(v) == 1 for _, v in points.values()):  # one run of each suite: numbers
        _single_values(ax, {label: float(v.iloc[0]) for label, (_, v) in points.items()}, unit)
        return
    for i, (label, (t, v)) in enumerate(points.items()):
        ax.plot(t, v, "o-", markersize=3.5, linewidth=1.4, label=_short(label, 40),
                color=SERIES_COLOURS[i % len(SERIES_COLOURS)])
    _shared_range(ax, when)
    _date_axis(ax)
    if len(points) > 1:
        ax.legend(fontsize=7)


def _short(label: str, width: int) -> str:
    """A label cut in the middle: its end ("... on vLLM 0.33.0") tells the lines apart."""
    return label if len(label) <= width else label[:width // 2 - 1] + "…" + label[-(width - width // 2):]


def _date_axis(ax: Any) -> None:
    locator = AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))


def dated_verdict_bars(ax: Any, times: pd.Series, counts: pd.DataFrame) -> None:
    """Classes new / known / expected per run, stacked, at each run's date."""
    when = pd.to_datetime(times, utc=True, errors="coerce")
    if len(when) == 1:
        row = counts.iloc[0]
        single_value(ax, float(sum(row[c] for c in VERDICT_COLOURS)), "classes",
                     when.iloc[0].strftime("%Y-%m-%d %H:%M UTC"))
        ax.text(0.5, 0.08, ", ".join(f"{int(row[c])} {c}" for c in VERDICT_COLOURS), ha="center",
                fontsize=8, color="#444", transform=ax.transAxes)
        return
    gaps = when.sort_values().diff().dropna()
    gaps = gaps[gaps > pd.Timedelta(0)]
    width = (gaps.min() * 0.8) if len(gaps) else pd.Timedelta(minutes=2)  # bars never overlap
    bottom = np.zeros(len(when))
    for col, colour in VERDICT_COLOURS.items():
        values = counts[col].astype(float).to_numpy()
        ax.bar(when, values, bottom=bottom, width=width, color=colour, label=col)
        bottom += values
    _shared_range(ax, when)
    _date_axis(ax)
    ax.legend(fontsize=7)


def campaign_curves(timeline: pd.DataFrame | None, classes: pd.DataFrame | None) -> bytes | None:
    """A campaign's two curves over its seconds: MRV2 arcs reached so far (the coverage
    timeline, one point per example) and finding classes found so far, per verdict."""
    has_cov = timeline is not None and len(timeline) > 0 and {"elapsed_s", "arcs_total"} <= set(timeline.columns)
    has_cls = (classes is not None and len(classes) > 0 and "first_elapsed_s" in classes.columns
               and classes["first_elapsed_s"].astype(float).notna().any())
    if not (has_cov or has_cls):
        return None
    fig, axes = new_axes(int(has_cov) + int(has_cls))
    ax_iter = iter(axes)
    if has_cov:
        ax = next(ax_iter)
        t = timeline["elapsed_s"].astype(float).to_numpy()
        arcs = timeline["arcs_total"].astype(float).to_numpy()
        if len(t) == 1:
            single_value(ax, arcs[0], "arcs", f"after {t[0]:.0f} s")
        else:
            ax.step(t, arcs, where="post", color=SERIES_COLOURS[0], linewidth=1.6)
            ax.set_xlim(left=0)
            ax.set_xlabel("seconds into the campaign", fontsize=8)
            ax.set_ylabel("MRV2 arcs reached", fontsize=8)
        title(ax, "coverage over time")
    if has_cls:
        ax = next(ax_iter)
        _classes_over_time(ax, classes, end=float(timeline["elapsed_s"].max()) if has_cov else None)
        title(ax, "finding classes found over time")
    return png(fig)


def _classes_over_time(ax: Any, classes: pd.DataFrame, end: float | None) -> None:
    first = classes.assign(_t=classes["first_elapsed_s"].astype(float)).dropna(subset=["_t"])
    end = max(float(first["_t"].max()), end or 0.0) or 1.0
    for verdict, colour in VERDICT_COLOURS.items():
        t = np.sort(first.loc[first["verdict"] == verdict, "_t"].to_numpy())
        if not len(t):
            continue
        xs = np.concatenate([[0.0], t, [end]])
        ys = np.concatenate([[0], np.arange(1, len(t) + 1), [len(t)]])
        ax.step(xs, ys, where="post", color=colour, linewidth=1.6, label=f"{verdict} ({len(t)})")
    ax.set_xlabel("seconds into the campaign", fontsize=8)
    ax.set_ylabel("classes so far", fontsize=8)
    ax.legend(fontsize=7)


def history_trends(trends: pd.DataFrame) -> bytes | None:
    """The history page's panels over run dates: classes per run, then each rate that any
    run measured (steps/s, examples/s, mutants detected, coverage), one line per suite (the
    page names a suite on each vLLM release apart: one line per suite and release)."""
    if trends.empty:
        return None
    panels: list[tuple[str, str, str]] = [("classes", "", "finding classes per run")]
    for col, unit, caption in (("steps_per_s", "steps/s", "steps/s (replay, fuzz)"),
                               ("examples_per_s", "examples/s", "examples/s (fuzz)"),
                               ("detected", "detected", "mutants detected (selftest)"),
                               ("coverage_lines_pct", "%", "coverage of MRV2 lines")):
        if col in trends.columns and trends[col].astype(float).notna().any():
            panels.append((col, unit, caption))
    fig, axes = new_axes(len(panels))
    for ax, (col, unit, caption) in zip(axes, panels):
        if col == "classes":
            dated_verdict_bars(ax, trends["created_utc"], trends[list(VERDICT_COLOURS)])
        else:
            dated_series(ax, trends["created_utc"],
                         {str(s): g[col].astype(float).reindex(trends.index)
                          for s, g in trends.groupby("suite", sort=True)}, unit)
        title(ax, caption)
    return png(fig)

