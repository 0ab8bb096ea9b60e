"""Self-consistency of one InputBatch, real or dummy, from the meaning of its fields.

A dummy batch (``InputBatch.make_dummy``) has no Steps behind it, so every batch is
also held to the relations its fields' comments in vLLM's ``input_batch.py`` state
(``check_batch_semantics``); ``value_pattern`` names what a wrong value looks like.

See docs/oracle.md, 'A batch's self-consistency' for the rules and their sources.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import StageObs
from simrig.reference.contract import stage_req_ids
from simrig.reference.reference import short


def field_value(stage: StageObs, name: str) -> Any:
    """A field's value (arrays as numpy), None when absent, None-valued or opaque."""
    f = stage.fields.get(name)
    if f is None or f.kind in ("none", "object"):
        return None
    return np.asarray(f.values) if f.kind in ("numpy", "torch") else f.values


def value_pattern(values: Any) -> str:
    """A name for a set of wrong values, so a known finding can say which wrong
    values it explains: "all_zero" (every value 0), else "other"."""
    arr = np.asarray(values)
    return "all_zero" if arr.size and not arr.astype(np.int64).any() else "other"


@guarded("semantics")
def check_batch_semantics(index: int, stage: StageObs) -> list[Finding]:
    """Findings for every relation (docs/oracle.md, 'A batch's self-consistency') ``stage`` breaks."""
    out: list[Finding] = []
    if stage.error is not None or not stage.fields:
        return out

    def add(name: str, expected: Any, actual: Any, rule: str) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=stage.stage, check="semantics",
                           rank=stage.rank, req_ids=stage_req_ids(stage), field=name,
                           expected=short(expected), actual=short(actual), message=rule))

    def same(name: str, expected: Any, actual: Any, rule: str) -> None:
        if actual is None or expected is None:
            return  # absence is the contract's finding (missing_field)
        e, a = np.asarray(expected), np.asarray(actual)
        if e.shape != a.shape or not np.array_equal(e.astype(np.int64), a.astype(np.int64)):
            add(name, e, a, rule)

    q = field_value(stage, "num_scheduled_tokens")
    num_reqs = len(q) if q is not None else None
    if q is None:
        return out
    q = q.astype(np.int64)
    qsl_expected = np.concatenate([[0], np.cumsum(q)])
    qsl = field_value(stage, "query_start_loc")
    same("query_start_loc", qsl_expected, None if qsl is None else qsl[: num_reqs + 1],
         "query_start_loc is not [0, cumsum(num_scheduled_tokens)]")
    qsl_np = field_value(stage, "query_start_loc_np")
    same("query_start_loc_np", qsl_expected, None if qsl_np is None else qsl_np[: num_reqs + 1],
         "query_start_loc_np is not [0, cumsum(num_scheduled_tokens)]")
    nc = field_value(stage, "num_computed_tokens_np")
    seq_lens = field_value(stage, "seq_lens")
    if nc is not None:
        nc = nc.astype(np.int64)[:num_reqs]
        # a row that schedules nothing (a PCP rank's placeholder row) is padding: seq_len 0
        # (prepare_pos_seq_lens: "pad unused seq_lens as 0")
        same("seq_lens", np.where(q > 0, nc + q, 0), None if seq_lens is None else seq_lens[:num_reqs],
             "seq_lens != num_computed_tokens + num_scheduled_tokens (0 for a row without tokens)")
        positions = field_value(stage, "positions")
        if positions is not None and len(positions) >= int(q.sum()):
            expected = np.concatenate([start + np.arange(n) for start, n in zip(nc, q)] or [[]])
            before = len(out)
            same("positions", expected, positions[: int(q.sum())],
                 "positions of a row are not num_computed_tokens .. num_computed_tokens + q - 1")
            if len(out) > before:  # name the wrong values' pattern: known findings match on it
                out[-1].extra["pattern"] = value_pattern(positions[: int(q.sum())])
    prefilling = field_value(stage, "is_prefilling_np")
    computed_prefill, prefill_len = (field_value(stage, "num_computed_prefill_tokens_np"),
                                     field_value(stage, "prefill_len_np"))
    if prefilling is not None and computed_prefill is not None and prefill_len is not None:
        same("is_prefilling_np", (computed_prefill < prefill_len)[:num_reqs], prefilling[:num_reqs],
             "is_prefilling_np != (num_computed_prefill_tokens_np < prefill_len_np)")
    has_prefill = field_value(stage, "has_prefill")
    if prefilling is not None and has_prefill is not None and bool(has_prefill) != bool(prefilling.any()):
        add("has_prefill", bool(prefilling.any()), bool(has_prefill), "has_prefill != any(is_prefilling_np)")
    eligible = field_value(stage, "decode_graph_eligible")
    if prefilling is not None and eligible is not None:
        as_decode = field_value(stage, "prefill_runs_as_decode_np")
        rows = prefilling[:num_reqs].astype(bool)
        if as_decode is not None:
            rows = rows & ~as_decode[:num_reqs].astype(bool)
        if bool(eligible) != (not rows.any()):
            add("decode_graph_eligible", not rows.any(), bool(eligible),
                "decode_graph_eligible != no prefill row, or only prefill rows that run as decodes")
    drafts = field_value(stage, "num_draft_tokens")
    idx, expanded = field_value(stage, "idx_mapping"), field_value(stage, "expanded_idx_mapping")
    if drafts == 0 and idx is not None and expanded is not None:
        same("expanded_idx_mapping", idx[:num_reqs], expanded[:num_reqs],
             "without drafts, expanded_idx_mapping must equal idx_mapping")
    _counts(index, stage, q, seq_lens, add)
    cu, logits = field_value(stage, "cu_num_logits"), field_value(stage, "logits_indices")
    if cu is not None and logits is not None and len(cu) > num_reqs:
        total = int(cu[num_reqs])
        if len(logits) < total or (total and not (0 <= logits[:total].min() and
                                                  logits[:total].max() < int(q.sum()))):
            add("logits_indices", f"{total} rows in [0, {int(q.sum())})", logits,
                "logits_indices must hold cu_num_logits[-1] rows inside the batch's tokens")
    return out


def _counts(index: int, stage: StageObs, q: np.ndarray, seq_lens: Any, add: Any) -> None:
    """The batch's scalar counts and per-logit positions against its own rows
    (comments of ``InputBatch``: "number of tokens in the batch", "Sum of draft
    tokens scheduled across requests", "[total_num_logits] position within
    request for each logit", "CPU upper bound on seq_lens"). ``add`` appends."""
    num_reqs = len(q)
    scalar = {k: field_value(stage, k) for k in ("num_reqs", "num_tokens", "num_reqs_after_padding",
                                                  "num_tokens_after_padding", "num_draft_tokens")}
    ids = field_value(stage, "req_ids")
    if scalar["num_reqs"] is not None and (scalar["num_reqs"] != num_reqs
                                           or (ids is not None and len(ids) != num_reqs)):
        add("num_reqs", num_reqs, scalar["num_reqs"], "num_reqs != rows of num_scheduled_tokens / req_ids")
    if scalar["num_tokens"] is not None and scalar["num_tokens"] != int(q.sum()):
        add("num_tokens", int(q.sum()), scalar["num_tokens"], "num_tokens != sum(num_scheduled_tokens)")
    for padded, real in (("num_reqs_after_padding", num_reqs), ("num_tokens_after_padding", int(q.sum()))):
        if scalar[padded] is not None and scalar[padded] < real:
            add(padded, f">= {real}", scalar[padded], f"{padded} is below the batch's own count")
    per_req = field_value(stage, "num_draft_tokens_per_req")
    drafts = 0 if per_req is None else int(np.asarray(per_req)[:num_reqs].sum())
    if scalar["num_draft_tokens"] is not None and scalar["num_draft_tokens"] != drafts:
        add("num_draft_tokens", drafts, scalar["num_draft_tokens"],
            "num_draft_tokens != sum(num_draft_tokens_per_req) (0 without them)")
    bound = field_value(stage, "seq_lens_cpu_upper_bound")
    if bound is not None and seq_lens is not None and len(bound) >= num_reqs and \
            (bound[:num_reqs].astype(np.int64) < np.asarray(seq_lens)[:num_reqs].astype(np.int64)).any():
        add("seq_lens_cpu_upper_bound", f">= {short(seq_lens[:num_reqs])}", bound[:num_reqs],
            "seq_lens_cpu_upper_bound is below seq_lens")
    limit = field_value(stage, "max_query_len")
    if limit is not None and num_reqs and int(limit) < int(q.max()):
        add("max_query_len", f">= {int(q.max())}", limit, "max_query_len (\"Longest query the batch may "
            "contain\") is below a query of the batch")
    cu, local = field_value(stage, "cu_num_logits"), field_value(stage, "expanded_local_pos")
    if cu is not None and len(cu) > num_reqs:  # "[num_reqs + 1]": 1 + drafts logits per request
        per_req_np = np.zeros(num_reqs, dtype=np.int64) if per_req is None else np.asarray(per_req)[:num_reqs]
        # a placeholder row (no token scheduled: a PCP idle rank) has no logit
        want_cu = np.concatenate([[0], np.cumsum(np.where(q > 0, 1 + per_req_np.astype(np.int64), 0))])
        if not np.array_equal(np.asarray(cu)[: num_reqs + 1].astype(np.int64), want_cu):
            add("cu_num_logits", want_cu, np.asarray(cu)[: num_reqs + 1],
                "cu_num_logits is not the cumulative 1 + num_draft_tokens_per_req of each request "
                "(0 for a row without tokens)")
    if cu is not None and local is not None and len(cu) > num_reqs:
        n = np.diff(np.asarray(cu)[: num_reqs + 1].astype(np.int64))
        want = np.concatenate([np.arange(k) for k in n] or [np.zeros(0, dtype=np.int64)])
        got = np.asarray(local)[: len(want)].astype(np.int64)
        if len(local) < len(want) or not np.array_equal(got, want):
            add("expanded_local_pos", want, got, "expanded_local_pos is not 0..n-1 within each "
                                                 "request's logit rows (cu_num_logits)")
