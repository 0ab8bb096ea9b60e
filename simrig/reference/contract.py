"""The dtype contract of the MRV2 input path, and step-to-step dtype drift.

``CONTRACT`` declares, per stage, the (kind, dtype) each output field promises, filled
from the installed 0.33.0 source (``GATHER_CONTRACT``, ``BATCH_CONTRACT``,
``PARTITION_CONTRACT``); ``check_contract`` judges one stage, where ``None`` is allowed
only under the condition vLLM documents (``FieldContract.none_when``, one of
``NONE_WHEN``). ``DriftTracker`` flags a field whose dtype changes between steps.

See docs/oracle.md, 'The dtype contract' for the stages and the documented ``None`` cases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import CAPTURE, DUMMY, GATHER, PARTITION, PREPARE, PROFILE, StageObs

INTP = np.dtype(np.intp).name  # "int64" on 64-bit platforms


NO_DRAFTS, NO_PREFILL, FEATURE_OFF = "no_drafts", "no_prefill", "feature_off"
NONE_WHEN = (NO_DRAFTS, NO_PREFILL, FEATURE_OFF)


@dataclass(frozen=True)
class FieldContract:
    kind: str  # "torch" | "numpy"
    dtype: str  # numpy / torch dtype name without prefix
    none_when: str = ""  # the documented condition for None (NONE_WHEN); "" = never None

    def __str__(self) -> str:
        return f"{self.kind} {self.dtype}"


def _t(dtype: str, none_when: str = "") -> FieldContract:
    return FieldContract("torch", dtype, none_when)


def _n(dtype: str, none_when: str = "") -> FieldContract:
    return FieldContract("numpy", dtype, none_when)


GATHER_CONTRACT: dict[str, FieldContract] = {
    "num_scheduled_tokens": _n("int32"),  # [num_reqs]
    "num_draft_tokens_np": _n("int32", NO_DRAFTS),  # [num_reqs], only with drafts
    "idx_mapping_np": _n(INTP),  # [num_reqs] batch idx -> slot
    "prefill_len_np": _n("int32"),
    "num_computed_prefill_tokens_np": _n("int32"),
    "is_prefilling_np": _n("bool"),
    "prefill_runs_as_decode_np": _n("bool", NO_PREFILL),
    "max_seq_len_np": _n("int32", FEATURE_OFF),
}

BATCH_CONTRACT: dict[str, FieldContract] = {
    "idx_mapping": _t("int64"),  # [num_reqs] slot indices
    "idx_mapping_np": _n(INTP),
    "expanded_idx_mapping": _t("int64"),  # [total_num_logits]
    "expanded_local_pos": _t("int32"),
    "num_scheduled_tokens": _n("int32"),
    "num_draft_tokens_per_req": _n("int32", NO_DRAFTS),
    "query_start_loc": _t("int32"),  # [num_reqs + 1]
    "query_start_loc_np": _n("int32"),
    "seq_lens": _t("int32"),
    "seq_lens_cpu_upper_bound": _t("int32"),
    "dcp_local_seq_lens": _t("int32", FEATURE_OFF),
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
    "prompt_lens": _t("int32", FEATURE_OFF),
    "max_seq_len_np": _n("int32", FEATURE_OFF),
    "prefill_runs_as_decode_np": _n("bool", NO_PREFILL),
}

PARTITION_CONTRACT: dict[str, FieldContract] = {
    **BATCH_CONTRACT,
    "pcp.global_query_lens_np": _n("int32"),
    "pcp.global_seq_lens_cpu_upper_bound_np": _n("int32"),
    "pcp.dcp_local_seq_lens_cpu_upper_bound": _t("int32", FEATURE_OFF),
    # global = gathered[hidden_restore_idx]; padded_gathered = global[padded_gather_idx]
    "manager.hidden_restore_idx": _t("int64"),
    "manager.padded_gather_idx": _t("int64"),
    "manager.gathered_kv_write_mask": _t("bool"),
}

CONTRACT: dict[str, dict[str, FieldContract]] = {
    GATHER: GATHER_CONTRACT,
    PREPARE: BATCH_CONTRACT,
    DUMMY: BATCH_CONTRACT,
    CAPTURE: BATCH_CONTRACT,
    PROFILE: BATCH_CONTRACT,  # the profile run's batch is a make_dummy batch too
    PARTITION: PARTITION_CONTRACT,
}

ARRAY_KINDS = ("torch", "numpy")


def stage_req_ids(stage: StageObs) -> tuple[str, ...]:
    """The requests a stage's batch holds; none for a dummy batch, whose ids
    are random placeholders (reports stay deterministic and small)."""
    if stage.stage in (DUMMY, CAPTURE, PROFILE):
        return ()
    f = stage.fields.get("req_ids")
    return tuple(str(r) for r in f.values) if f is not None and f.kind == "list" else ()


@guarded("contract")
def check_contract(index: int, stage: StageObs, has_drafts: bool | None = None) -> list[Finding]:
    """Findings for every declared field of ``stage`` whose dtype breaks the
    table, that is missing, or that is None outside its documented condition.

    ``has_drafts``: whether the step scheduled drafts (the Step knows; a
    stage's own ``num_draft_tokens`` scalar is used when not given).
    """
    table = CONTRACT.get(stage.stage)
    if not table or stage.error is not None or not stage.fields:
        return []  # a stage that raised (or never ran) has no output to check
    out = []
    for name, promise in table.items():
        obs = stage.fields.get(name)
        if obs is None and stage.declared is not None and name.split(".")[0] not in stage.declared:
            continue  # this release's type has no such field: a release difference (doctor, compare)
        if obs is None or obs.kind == "none":
            if obs is not None and _none_allowed(promise.none_when, stage, has_drafts):
                continue
            what = "missing" if obs is None else "None"
            out.append(Finding(
                kind=fk.MISSING_FIELD, step=index, stage=stage.stage, check="contract",
                rank=stage.rank, req_ids=stage_req_ids(stage), field=name,
                expected=str(promise), actual=what,
                message=f"declared {promise}, observed {what}"
                        + (f" (None only when {promise.none_when})" if promise.none_when else "")))
            continue
        if (obs.kind, obs.dtype) != (promise.kind, promise.dtype):
            out.append(Finding(
                kind=fk.DTYPE_DRIFT, step=index, stage=stage.stage, check="contract",
                rank=stage.rank, req_ids=stage_req_ids(stage), field=name,
                expected=str(promise), actual=f"{obs.kind} {obs.dtype}".strip(),
                message=f"declared {promise}, observed {obs.kind} {obs.dtype}"))
    return out


def _scalar(stage: StageObs, name: str) -> object:
    f = stage.fields.get(name)
    return f.values if f is not None and f.kind == "scalar" else None


def _none_allowed(condition: str, stage: StageObs, has_drafts: bool | None) -> bool:
    """Does the stage meet the documented condition under which a field is None?"""
    if condition == FEATURE_OFF:
        return True
    if condition == NO_PREFILL:
        has_prefill = _scalar(stage, "has_prefill")
        return has_prefill is not None and not bool(has_prefill)
    if condition == NO_DRAFTS:
        if has_drafts is None:
            drafts = _scalar(stage, "num_draft_tokens")
            has_drafts = bool(drafts) if drafts is not None else False
        return not has_drafts
    return False


class DriftTracker:
    """The same (stage, field) must keep its dtype across the steps of a trace.

    Remembers the last (kind, dtype) seen per (stage, field) and reports each
    change once, at the step where it happens. ``None`` values are skipped.
    """

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], tuple[str, str, int]] = {}

    @guarded("drift")
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
