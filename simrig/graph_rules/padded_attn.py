"""Padding on every path: what rows and tokens past the real batch must hold.

The reference model and ``simrig/reference/blocks.py`` judge the real step's padded
values; this module adds the rest: the padded shapes of the attention tables
(``check_padded_shapes``), every dummy's block tables and slot mappings
(``check_dummy_attn``) and a uniform dummy's tokens (``check_dummy_shape``), each rule
from the meaning vLLM documents (``simrig/ledger/evidence.py`` holds the cited lines).

See docs/cudagraph.md, 'Padding on every path' for the rules and their vLLM sources.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.ledger.evidence import RULES
from simrig.observe import CAPTURE, DUMMY, ROWS_PAST, StageObs
from simrig.reference.blocks import (BLOCK_TABLES, dcp_local_seq_len, NULL_BLOCK_ID, PAD_SLOT_ID, ROWS_PAST_FILLED,
                                     SLOT_MAPPINGS)
from simrig.reference.contract import stage_req_ids
from simrig.reference.semantics import field_value
from simrig.step import RunnerConfig

CHECK = "padding"


def _tables(stage: StageObs) -> list[tuple[str, np.ndarray]]:
    """(field, table) of every KV cache group the stage observed, in group order."""
    out, group = [], 0
    while (table := field_value(stage, f"{BLOCK_TABLES}.{group}")) is not None:
        out.append((f"{BLOCK_TABLES}.{group}", np.asarray(table)))
        group += 1
    return out


def _adder(index: int, stage: StageObs, out: list[Finding]) -> Any:
    def add(name: str, expected: Any, actual: Any, message: str, pattern: str | None = None) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=stage.stage, check=CHECK,
                           rank=stage.rank, req_ids=stage_req_ids(stage), field=name,
                           expected=str(expected), actual=str(actual), message=message,
                           extra={"pattern": pattern} if pattern else {}))
    return add


@guarded(CHECK)
def check_padded_shapes(index: int, config: RunnerConfig, stage: StageObs) -> list[Finding]:
    """Rule PADDED SHAPES on the batch prepare_attn ran (prepare, or PCP rank 0's partition)."""
    out: list[Finding] = []
    if stage.error is not None or not stage.fields:
        return out
    add = _adder(index, stage, out)
    rows = field_value(stage, "num_reqs_after_padding")
    if rows is not None:
        for name, table in _tables(stage):
            if table.ndim != 2 or table.shape[0] != int(rows):
                add(name, f"[{int(rows)}, max_num_blocks]", list(table.shape),
                    f"PADDED SHAPES: one block-table row per padded request ({RULES['attn_rows'].where()})")
    local, seq_lens = field_value(stage, "dcp_local_seq_lens"), field_value(stage, "seq_lens")
    if config.dcp_size > 1 and rows is not None and local is not None and seq_lens is not None:
        # the FULL graph's attention reads every padded row: each holds this DCP rank's share
        # of its own seq_len (0 for a padded row: "pad unused seq_lens as 0"), the rows past
        # the real ones included
        rank = stage.dcp_rank
        want = [dcp_local_seq_len(int(v), config.dcp_size, rank) for v in np.asarray(seq_lens)[:int(rows)]]
        got = np.asarray(local).astype(np.int64)[:int(rows)].tolist()
        if got != want:
            add("dcp_local_seq_lens", want, got, f"PADDED SHAPES: every padded row's DCP local length is "
                f"DCP rank {rank}'s share of its seq_len ({RULES['attn_rows'].where()})")
    tokens, mapping = field_value(stage, "num_tokens_after_padding"), field_value(stage, SLOT_MAPPINGS)
    if config.pcp_size == 1 and tokens is not None and mapping is not None:
        mapping = np.asarray(mapping)
        if mapping.ndim != 2 or mapping.shape[1] != int(tokens):
            add(SLOT_MAPPINGS, f"[num_kv_cache_groups, {int(tokens)}]", list(mapping.shape),
                f"PADDED SHAPES: one slot per padded token ({RULES['attn_slots'].where()})")
    return out


@guarded(CHECK)
def check_dummy_attn(index: int, config: RunnerConfig, stage: StageObs) -> list[Finding]:
    """Rules DUMMY NULL ROWS and DUMMY PAD SLOTS on an idle or capture dummy."""
    out: list[Finding] = []
    if stage.stage not in (DUMMY, CAPTURE) or stage.error is not None or not stage.fields:
        return out
    add = _adder(index, stage, out)
    computed = field_value(stage, "num_computed_tokens_np")
    for name, table in _tables(stage):
        if table.ndim != 2:
            continue
        judged = np.ones(table.shape[0], dtype=bool)
        if computed is not None:  # rows given context (set_dummy_context) may hold its blocks
            with_context = np.asarray(computed).astype(np.int64) > 0
            judged[:len(with_context)] &= ~with_context[:table.shape[0]]
        bad = np.flatnonzero(judged & np.any(table != NULL_BLOCK_ID, axis=1))
        if bad.size:
            add(name, f"row {int(bad[0])}: null block only", table[bad[0]].tolist(),
                f"DUMMY NULL ROWS: {bad.size} of {table.shape[0]} dummy rows hold block ids "
                f"({RULES['dummy_null_rows'].where()})")
        past_name = f"{ROWS_PAST}.{name.rsplit('.', 1)[1]}"
        past = field_value(stage, past_name)
        if past is not None and len(past):
            add(past_name, [], np.asarray(past).tolist(),
                f"ROWS PAST: rows of the shared table past the dummy's {table.shape[0]} still hold "
                f"a larger earlier batch's block ids ({RULES['forward_tables'].where()}; "
                f"{RULES['rows_past'].where()})", pattern=ROWS_PAST_FILLED)
    mapping, tokens = field_value(stage, SLOT_MAPPINGS), field_value(stage, "num_tokens")
    if mapping is not None:
        mapping = np.asarray(mapping)
        wrong = np.flatnonzero(mapping.reshape(-1) != PAD_SLOT_ID) if mapping.size else np.zeros(0)
        if wrong.size:
            add(SLOT_MAPPINGS, f"all {PAD_SLOT_ID}", f"{wrong.size} of {mapping.size} set "
                f"(first {int(mapping.reshape(-1)[wrong[0]])})",
                f"DUMMY PAD SLOTS: a dummy token's slot is not PAD_SLOT_ID ({RULES['dummy_pad_slots'].where()})")
        if tokens is not None and (mapping.ndim != 2 or mapping.shape[1] < int(tokens)):
            add(SLOT_MAPPINGS, f"[num_kv_cache_groups, >= {int(tokens)}]", list(mapping.shape),
                "DUMMY PAD SLOTS: a slot for every dummy token")
    return out


@guarded(CHECK)
def check_dummy_shape(index: int, stage: StageObs) -> list[Finding]:
    """Rules UNIFORM DUMMY (idle dummy) and MIXED FULL BOUND (capture dummies)."""
    out: list[Finding] = []
    if stage.stage not in (DUMMY, CAPTURE) or stage.error is not None or not stage.fields:
        return out
    add = _adder(index, stage, out)
    q = field_value(stage, "num_scheduled_tokens")
    if q is None or not len(q):
        return out
    q = np.asarray(q).astype(np.int64)
    u = field_value(stage, "desc.uniform_token_count")
    if stage.stage == DUMMY and u is not None and (q != int(u)).any():
        add("num_scheduled_tokens", f"every query {int(u)} tokens", q.tolist(),
            f"UNIFORM DUMMY: the idle dummy of a uniform-decode descriptor (u={int(u)}) is not "
            f"uniform ({RULES['descriptor'].where()})")
    mode, n_tok = field_value(stage, "desc.cg_mode"), field_value(stage, "desc.num_tokens")
    bound, promised = field_value(stage, "desc.max_query_len"), field_value(stage, "max_query_len")
    # max_query_len None is no absence of a bound: "Set when a cudagraph descriptor promises a
    # query length this batch's own split does not reach" (RULES['promised_query']), so unset
    # the batch promises its own longest query (and prepare_attn builds the metadata from it).
    unset = "max_query_len" in stage.fields and promised is None
    effective = int(q.max()) if unset else promised
    if (stage.stage == CAPTURE and mode == "FULL" and u is None and bound is None and n_tok is not None
            and effective is not None and int(effective) < int(n_tok)):
        shown = f"None (its own longest query {int(effective)})" if unset else promised
        add("max_query_len", f">= {int(n_tok)}", shown,
            f"MIXED FULL BOUND: a mixed FULL graph replays a single prefill of up to {int(n_tok)} "
            f"tokens, its dummy promises {int(effective)} ({RULES['mixed_full_query'].where()}; "
            f"unset: {RULES['promised_query'].where()})")
        if unset:  # the signature of the bound left to the dummy's own split
            out[-1].extra["pattern"] = "unset_bound_below_graph_tokens"
    return out
