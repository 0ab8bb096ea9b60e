"""The dtype contract of the MRV2 input path, and step-to-step dtype drift.

The table below declares, per stage, the (kind, dtype) every output field of
the boundary promises. It was filled from the installed 0.33.0 source
(``input_batch.py``, ``model_runner.py``, ``pcp_manager.py``): index arrays
are ``np.intp`` / ``torch.int64``, lengths and offsets int32, masks bool.

    stage       object observed                 table
    ─────       ───────────────                 ─────
    gather      BatchReqState                   GATHER_CONTRACT
    prepare     InputBatch (global)             BATCH_CONTRACT
    dummy       InputBatch.make_dummy           BATCH_CONTRACT (same promise)
    partition   rank-local InputBatch + the     BATCH_CONTRACT + PCP/manager
                manager's index arrays           arrays

A field absent from the table is not checked (it is still listed by
``simrig contract snapshot``). An optional field observed as ``None`` is not
a violation: the promise is about its dtype when present.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simrig.checks import findings as fk
from simrig.checks.findings import Finding
from simrig.observe import DUMMY, GATHER, PARTITION, PREPARE, StageObs

INTP = np.dtype(np.intp).name  # "int64" on 64-bit platforms


@dataclass(frozen=True)
class FieldContract:
    kind: str  # "torch" | "numpy"
    dtype: str  # numpy / torch dtype name without prefix

    def __str__(self) -> str:
        return f"{self.kind} {self.dtype}"


def _t(dtype: str) -> FieldContract:
    return FieldContract("torch", dtype)


def _n(dtype: str) -> FieldContract:
    return FieldContract("numpy", dtype)


GATHER_CONTRACT: dict[str, FieldContract] = {
    "num_scheduled_tokens": _n("int32"),  # [num_reqs]
    "num_draft_tokens_np": _n("int32"),  # [num_reqs], only with drafts
    "idx_mapping_np": _n(INTP),  # [num_reqs] batch idx -> slot
    "prefill_len_np": _n("int32"),
    "num_computed_prefill_tokens_np": _n("int32"),
    "is_prefilling_np": _n("bool"),
    "prefill_runs_as_decode_np": _n("bool"),
    "max_seq_len_np": _n("int32"),
}

BATCH_CONTRACT: dict[str, FieldContract] = {
    "idx_mapping": _t("int64"),  # [num_reqs] slot indices
    "idx_mapping_np": _n(INTP),
    "expanded_idx_mapping": _t("int64"),  # [total_num_logits]
    "expanded_local_pos": _t("int32"),
    "num_scheduled_tokens": _n("int32"),
    "num_draft_tokens_per_req": _n("int32"),
    "query_start_loc": _t("int32"),  # [num_reqs + 1]
    "query_start_loc_np": _n("int32"),
    "seq_lens": _t("int32"),
    "seq_lens_cpu_upper_bound": _t("int32"),
    "dcp_local_seq_lens": _t("int32"),
    "num_computed_tokens_np": _n("int32"),
    "prefill_len_np": _n("int32"),
    "num_computed_prefill_tokens_np": _n("int32"),
    "is_prefilling_np": _n("bool"),
    "input_ids": _t("int32"),  # [num_tokens]
    "positions": _t("int64"),
    "is_padding": _t("bool"),
    "logits_indices": _t("int64"),  # [total_num_logits] rows of hidden states
    "cu_num_logits": _t("int32"),
    "cu_num_logits_np": _n("int32"),
    "prompt_lens": _t("int32"),
    "max_seq_len_np": _n("int32"),
    "prefill_runs_as_decode_np": _n("bool"),
}

PARTITION_CONTRACT: dict[str, FieldContract] = {
    **BATCH_CONTRACT,
    "pcp.global_query_lens_np": _n("int32"),
    "pcp.global_seq_lens_cpu_upper_bound_np": _n("int32"),
    "pcp.dcp_local_seq_lens_cpu_upper_bound": _t("int32"),
    # global = gathered[hidden_restore_idx]; padded_gathered = global[padded_gather_idx]
    "manager.hidden_restore_idx": _t("int64"),
    "manager.padded_gather_idx": _t("int64"),
    "manager.gathered_kv_write_mask": _t("bool"),
}

CONTRACT: dict[str, dict[str, FieldContract]] = {
    GATHER: GATHER_CONTRACT,
    PREPARE: BATCH_CONTRACT,
    DUMMY: BATCH_CONTRACT,
    PARTITION: PARTITION_CONTRACT,
}

ARRAY_KINDS = ("torch", "numpy")


def stage_req_ids(stage: StageObs) -> tuple[str, ...]:
    """The requests a stage's batch holds; none for a dummy batch, whose ids
    are random placeholders (reports stay deterministic and small)."""
    if stage.stage == "dummy":
        return ()
    f = stage.fields.get("req_ids")
    return tuple(str(r) for r in f.values) if f is not None and f.kind == "list" else ()


def check_contract(index: int, stage: StageObs) -> list[Finding]:
    """Findings for every declared field of ``stage`` whose dtype breaks the table."""
    table = CONTRACT.get(stage.stage)
    if not table or stage.error is not None:
        return []
    out = []
    for name, promise in table.items():
        obs = stage.fields.get(name)
        if obs is None or obs.kind == "none":
            continue
        if (obs.kind, obs.dtype) != (promise.kind, promise.dtype):
            out.append(Finding(
                kind=fk.DTYPE_DRIFT, step=index, stage=stage.stage, check="contract",
                rank=stage.rank, req_ids=stage_req_ids(stage), field=name,
                expected=str(promise), actual=f"{obs.kind} {obs.dtype}".strip(),
                message=f"declared {promise}, observed {obs.kind} {obs.dtype}"))
    return out


class DriftTracker:
    """The same (stage, field) must keep its dtype across the steps of a trace.

    Remembers the last (kind, dtype) seen per (stage, field) and reports each
    change once, at the step where it happens. ``None`` values are skipped.
    """

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], tuple[str, str, int]] = {}

    def check(self, index: int, stage: StageObs) -> list[Finding]:
        out = []
        for name, obs in stage.fields.items():
            if obs.kind in ("none", "list", "object"):
                continue
            key = (stage.stage, name)
            now = (obs.kind, obs.dtype)
            before = self.seen.get(key)
            self.seen[key] = (*now, index)
            if before is None or before[:2] == now:
                continue
            out.append(Finding(
                kind=fk.DTYPE_DRIFT, step=index, stage=stage.stage, check="drift",
                rank=stage.rank, req_ids=stage_req_ids(stage), field=name,
                expected=f"{before[0]} {before[1]}", actual=f"{now[0]} {now[1]}",
                message=f"was {before[0]} {before[1]} at step {before[2]}, "
                        f"now {now[0]} {now[1]}"))
        return out
