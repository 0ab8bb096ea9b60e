"""Report plots, rendered off-screen (Agg) to PNG bytes for inline HTML.

Each function takes the steps table and returns PNG bytes, or None when the
table has nothing to draw. No pyplot: figures are plain ``Figure`` objects, so
no global state leaks between reports.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simrig.observe import STAGES
from simrig.views.trends import style

MAX_POINTS = 1_500  # steps per curve before binning (means per bin)
MAX_PANELS = 3  # traces drawn as panels; more are summarised in one


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    # No timestamp / software metadata: the same data gives the same bytes.
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return buf.getvalue()


def _binned(x: np.ndarray, ys: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Means over equal bins when there are more than MAX_POINTS steps."""
    if len(x) <= MAX_POINTS:
        return x, ys
    edges = np.linspace(0, len(x), MAX_POINTS + 1).astype(int)
    starts = edges[:-1]
    counts = np.diff(edges)
    xb = np.add.reduceat(x.astype(float), starts) / counts
    return xb, [np.add.reduceat(y.astype(float), starts) / counts for y in ys]


def per_step(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (trace, pcp_size, step): the lifecycle row always exists."""
    rows = steps[steps["stage"].astype(str) == "lifecycle"]
    return rows[["trace", "pcp_size", "step", "num_decode", "num_prefill", "num_spec_tokens"]]


def batch_composition(steps: pd.DataFrame) -> bytes | None:
    """Stacked decode / prefill requests and draft tokens over steps (composition
    does not depend on the PCP size: the first size is drawn).

    Up to MAX_PANELS traces get a panel each; more (a campaign's examples, a
    corpus) are drawn as one summary panel, every trace's steps in run order."""
    needed = {"trace", "pcp_size", "step", "stage", "num_decode", "num_prefill", "num_spec_tokens"}
    if steps.empty or not needed <= set(steps.columns):
        return None
    table = per_step(steps)
    traces = list(dict.fromkeys(table["trace"].astype(str)))
    if len(traces) > MAX_PANELS:
        first_size = table.groupby(table["trace"].astype(str), observed=True)["pcp_size"].transform("first")
        panels = [(f"all {len(traces):,} traces / examples, steps in run order",
                   table[table["pcp_size"] == first_size].reset_index(drop=True))]
    else:
        panels = []
        for name in traces:
            t = table[table["trace"].astype(str) == name]
            panels.append((name, t[t["pcp_size"] == t["pcp_size"].iloc[0]]))
    fig = Figure(figsize=(9, 2.4 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (name, t) in zip(axes, panels):
        style(ax)
        summary_panel = len(traces) > MAX_PANELS
        steps_x = np.arange(len(t)) if summary_panel else t["step"].to_numpy()
        x, (dec, pre, spec) = _binned(steps_x,
                                      [t["num_decode"].to_numpy(), t["num_prefill"].to_numpy(),
                                       t["num_spec_tokens"].to_numpy()])
        # step="post" draws step k over [k, k+1): close the last step too.
        x = np.append(x, x[-1] + (x[-1] - x[-2] if len(x) > 1 else 1))
        dec, pre, spec = (np.append(v, v[-1]) for v in (dec, pre, spec))
        ax.stackplot(x, dec, pre, spec, labels=["decode requests", "prefill requests",
                                               "draft tokens"],
                     colors=["#4C72B0", "#DD8452", "#55A868"], step="post")
        ax.set_title(name, fontsize=9, loc="left")
        ax.set_ylabel("count")
        ax.margins(x=0)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("step" if len(traces) <= MAX_PANELS else "step (all traces, in run order)")
    return _png(fig)


def stage_latency(steps: pd.DataFrame) -> bytes | None:
    """Box plot of each stage's duration (ms, log scale), in execution order."""
    if steps.empty or "duration_ms" not in steps.columns:
        return None
    stage = steps["stage"].astype(str)
    names = [s for s in STAGES if (stage == s).any()]
    data = [steps.loc[stage == s, "duration_ms"].to_numpy() for s in names]
    data = [np.clip(d[np.isfinite(d)], 1e-4, None) for d in data]
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax = fig.subplots()
    style(ax)
    ax.boxplot(data, showfliers=True, flierprops={"markersize": 2, "alpha": 0.4})
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_yscale("log")
    ax.set_ylabel("duration per call (ms)")
    ax.set_title("stage latency (one call per step; partition: per rank)", fontsize=9, loc="left")
    return _png(fig)
