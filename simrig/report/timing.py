"""Where the time goes: wall time inside real vLLM calls vs the rig.

Every stage row of the steps table carries ``duration_ms``, the time of one real vLLM
call; ``time_share`` splits a run's wall time into vLLM's (per stage, plus the
``UNSTAGED`` rest of vLLM's own time) and the rig's, and ``time_share_line`` says it in
one line.

See docs/benchmarks.md, 'Performance: where a campaign's time goes'.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from simrig.observe import STAGES


UNSTAGED = "unstaged"  # vLLM time outside the probed stage calls


def time_share(steps: pd.DataFrame, wall_s: float, vllm_s: float | None = None) -> dict[str, Any]:
    """{"wall_s", "vllm_s", "rig_s", "vllm_share", "rig_share", "stages": {stage: {"s", "share"}}}.

    ``vllm_s``: the measured time inside vLLM's calls (``StepObs.vllm_s`` summed);
    what it holds beyond the stage rows is the ``unstaged`` entry::

        wall_s ─┬─ vllm_s ─┬─ per stage: lifecycle, gather, prepare, postprocess, partition, dummy
                │          └─ unstaged: vLLM's own time outside the probed calls (prepare_attn's
                │             block-table and slot kernels, staged writes, execute_model's glue,
                │             sample_tokens past postprocess, a runner's build (vLLM's
                │             constructors), profile run and capture)
                └─ rig_s  ── generation, checks, bookkeeping (wall - vllm)

    Without ``vllm_s`` only the stage rows are summed, which leaves the unstaged part on
    the rig's side.
    """
    wall = float(wall_s) if wall_s and wall_s > 0 else 0.0
    per_stage: dict[str, float] = {}
    if not steps.empty and {"stage", "duration_ms"} <= set(steps.columns):
        sums = steps.groupby(steps["stage"].astype(str), observed=True)["duration_ms"].sum()
        order = {s: i for i, s in enumerate(STAGES)}
        for stage in sorted(sums.index, key=lambda s: order.get(s, len(order))):
            per_stage[stage] = float(sums[stage]) / 1e3
    vllm = sum(per_stage.values())
    if vllm_s is not None and vllm_s > vllm:
        per_stage[UNSTAGED] = vllm_s - vllm
        vllm = vllm_s
    wall = max(wall, vllm)  # a wall clock can never be shorter than what it contains

    def share(x: float) -> float:
        return round(x / wall, 4) if wall > 0 else 0.0

    return {"wall_s": round(wall, 3), "vllm_s": round(vllm, 3), "rig_s": round(wall - vllm, 3),
            "vllm_share": share(vllm), "rig_share": share(wall - vllm),
            "stages": {s: {"s": round(v, 3), "share": share(v)} for s, v in per_stage.items()}}


def time_share_line(share: dict[str, Any]) -> str:
    """'time: 62% in vLLM (prepare 55%, gather 3%, …), 38% rig'."""
    if not share or not share.get("wall_s"):
        return "time: (nothing measured)"
    stages = sorted(share.get("stages", {}).items(), key=lambda kv: -kv[1]["share"])
    parts = ", ".join(f"{s} {v['share']:.0%}" for s, v in stages if v["share"] >= 0.005)
    return (f"time: {share['vllm_share']:.0%} inside vLLM calls ({parts or 'all < 1%'}), "
            f"{share['rig_share']:.0%} rig (generation, checks, bookkeeping) of {share['wall_s']:.1f} s")
