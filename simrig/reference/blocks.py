"""Block tables and slot mappings, judged from what they mean (never from vLLM's kernels).

``BlockTracker`` follows each live request's block ids from the Steps alone;
``check_attn_blocks`` holds the prepare stage's block tables, slot mappings and
``dcp_local_seq_lens`` to their documented meaning (``expected_slot``,
``dcp_local_seq_len``, ``below_window``), on every release alike.

See docs/oracle.md, 'Block tables and slot mappings' for each rule and its vLLM source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import ROWS_PAST, StageObs
from simrig.reference.comparer import short
from simrig.reference.reference import GlobalBatch
from simrig.step import RunnerConfig, Step, block_groups

PAD_SLOT_ID = -1  # vllm.v1.attention.backends.utils.PAD_SLOT_ID
NULL_BLOCK_ID = 0  # vllm.v1.attention.backends.utils.NULL_BLOCK_ID
CP_INTERLEAVE = 1  # the interleave the harness builds BlockTables with
BLOCK_TABLES = "attn.block_tables"  # + ".<group>"
# the one form ROWS PAST names: some row past the handed ones holds a block id
ROWS_PAST_FILLED = "rows_past_filled"
SLOT_MAPPINGS = "attn.slot_mappings"
DCP_LOCAL_SEQ_LENS = "dcp_local_seq_lens"


class BlockTracker:
    """Each live request's block ids per KV-cache group, from the Steps (rule TRACK).

    Call ``apply(step)`` once per step, before checking that step's batch.
    """

    def __init__(self, num_groups: int = 1):
        self.num_groups = num_groups
        self.blocks: dict[str, list[list[int]]] = {}

    def apply(self, step: Step) -> None:
        for req_id in (*step.finished, *step.preempted):
            self.blocks.pop(req_id, None)
        for req in step.new_requests:
            self.blocks[req.req_id] = block_groups(req.block_ids, self.num_groups)
        for upd in step.cached:
            if upd.new_block_ids is None:
                continue
            if upd.resumed or upd.req_id not in self.blocks:
                self.blocks[upd.req_id] = [[] for _ in range(self.num_groups)]
            for held, new in zip(self.blocks[upd.req_id], block_groups(upd.new_block_ids, self.num_groups)):
                held.extend(new)

    def of(self, req_id: str, group: int = 0) -> list[int]:
        groups = self.blocks.get(req_id)
        return list(groups[group]) if groups is not None else []


def expected_slot(blocks: Sequence[int], position: int, block_size: int, dcp_size: int = 1,
                  dcp_rank: int = 0, interleave: int = CP_INTERLEAVE) -> int | None:
    """Rule SLOT: the slot of ``position`` on DCP rank ``dcp_rank``; PAD_SLOT_ID when
    another rank stores it; None when ``blocks`` does not reach the position."""
    span = block_size * dcp_size  # tokens one block id covers
    index = position // span
    if index >= len(blocks):
        return None
    if (position // interleave) % dcp_size != dcp_rank:
        return PAD_SLOT_ID
    start = index * span
    offset = sum(1 for t in range(start, position) if (t // interleave) % dcp_size == dcp_rank)
    return int(blocks[index]) * block_size + offset


def dcp_local_seq_len(seq_len: int, dcp_size: int, dcp_rank: int, interleave: int = CP_INTERLEAVE) -> int:
    """Rule DCP LOCAL SEQ LENS: tokens t < seq_len stored on ``dcp_rank``."""
    return sum(1 for t in range(seq_len) if (t // interleave) % dcp_size == dcp_rank)


def _array(stage: StageObs, name: str) -> np.ndarray | None:
    obs = stage.fields.get(name)
    if obs is None or not isinstance(obs.values, np.ndarray):
        return None
    return obs.values


def below_window(config: RunnerConfig, group: int, num_computed: int) -> int:
    """Rule BELOW WINDOW: leading entries of ``group`` wholly below the window of a
    request whose first scheduled position is ``num_computed`` (0: none)."""
    spec = config.kv_groups[group]
    if spec.kind != "sliding_window" or config.dcp_size > 1 or config.pcp_size > 1:
        return 0
    return max(0, num_computed - (spec.window - 1)) // config.group_block_size(group)


def _token_slots(config: RunnerConfig, tracker: BlockTracker, batch: GlobalBatch, group: int,
                 dcp_rank: int) -> list[int | None]:
    """Rule SLOT for every real token of ``batch`` (None: the trace gave too few blocks)."""
    out: list[int | None] = []
    qsl = [int(x) for x in batch.query_start_loc]
    for i, req_id in enumerate(batch.req_ids):
        blocks = tracker.of(req_id, group)
        for t in range(qsl[i], qsl[i + 1]):
            out.append(expected_slot(blocks, int(batch.positions[t]), config.group_block_size(group),
                                     config.dcp_size, dcp_rank))
    return out


@guarded("blocks")
def check_attn_blocks(config: RunnerConfig, tracker: BlockTracker, index: int, stage: StageObs,
                      batch: GlobalBatch, row_req_ids: Sequence[str] | None = None) -> list[Finding]:
    """Findings for the prepare stage's block tables, slot mappings and DCP local seq lens.

    The caller passes:
      config       the run's RunnerConfig (block_size, dcp_size, pcp_size)
      tracker      a BlockTracker that has ``apply``-ed every step up to and including this one
      index        the step index
      stage        the prepare StageObs (its ``dcp_rank`` is the DCP rank judged) carrying
                   ``attn.block_tables.<g>``, ``attn.slot_mappings`` and, under DCP,
                   ``dcp_local_seq_lens``; absent fields are not judged
      batch        the reference model's GlobalBatch in the observed batch order
                   (ReferenceModel.global_batch(step, observed order)): req_ids,
                   query_start_loc, positions, num_computed, query_lens
      row_req_ids  the requests of the block-table rows, in order, when they are not
                   ``batch.req_ids`` (under PCP: the rank-local batch's requests)
    """
    rows = list(batch.req_ids if row_req_ids is None else row_req_ids)
    dcp_rank = stage.dcp_rank if config.dcp_size > 1 else 0
    out: list[Finding] = []
    computed = {r: int(c) for r, c in zip(batch.req_ids, batch.num_computed)}

    def mismatch(name: str, ids: Sequence[str], expected: Any, actual: Any, rule: str,
                 pattern: str | None = None) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=stage.stage, check="blocks",
                           rank=stage.rank, req_ids=tuple(ids), field=name,
                           expected=short(expected), actual=short(actual), message=rule,
                           extra={"dcp_rank": dcp_rank, **({"pattern": pattern} if pattern else {})}))

    for group in range(tracker.num_groups):
        name = f"{BLOCK_TABLES}.{group}"
        table = _array(stage, name)
        if table is None:
            continue
        if table.ndim != 2 or table.shape[0] < len(rows):
            mismatch(name, rows, f"[>= {len(rows)}, max_num_blocks]", list(table.shape),
                     "one row per batch request (padded rows after them)")
            continue
        for i, req_id in enumerate(rows):
            blocks = tracker.of(req_id, group)
            got = table[i, :len(blocks)].tolist()
            skipped = min(below_window(config, group, computed.get(req_id, 0)), len(blocks))
            nulled = [NULL_BLOCK_ID] * skipped + blocks[skipped:]
            if got != nulled:
                # the one form known findings name: the entries below the window kept as
                # sent (a release before the nulling, or a window the nulling misses)
                kept = bool(skipped and got == blocks)
                mismatch(name, (req_id,), nulled, got,
                         f"ROWS: row {i} must start with request {req_id}'s blocks"
                         + (f" (BELOW WINDOW: its first {skipped} null)" if skipped else ""),
                         pattern=f"below_window_kept:window={config.kv_groups[group].window}" if kept else None)
        padded = table[len(rows):]
        if padded.size and np.any(padded != NULL_BLOCK_ID):
            bad = len(rows) + int(np.argwhere(np.any(padded != NULL_BLOCK_ID, axis=1))[0][0])
            mismatch(name, (), [NULL_BLOCK_ID] * table.shape[1], table[bad].tolist(),
                     f"PADDED ROWS: row {bad} is past the batch's {len(rows)} requests: null block only")

        past = _array(stage, f"{ROWS_PAST}.{group}")
        if past is not None and past.size:
            mismatch(f"{ROWS_PAST}.{group}", (), [], past.tolist(),
                     f"ROWS PAST: rows {past.tolist()} of the shared table, past the {table.shape[0]} "
                     "handed to attention, still hold a larger earlier batch's block ids: null block only",
                     pattern=ROWS_PAST_FILLED)

    mapping = _array(stage, SLOT_MAPPINGS)
    if mapping is not None:
        _check_slot_mappings(config, tracker, batch, mapping, dcp_rank, mismatch)
    local = _array(stage, DCP_LOCAL_SEQ_LENS)
    if local is not None and config.dcp_size > 1 and config.pcp_size == 1:
        seq_lens = [int(nc + q) for nc, q in zip(batch.num_computed, batch.query_lens)]
        expected = [dcp_local_seq_len(s, config.dcp_size, dcp_rank) for s in seq_lens]
        expected += [0] * (len(local) - len(expected))
        if local.tolist() != expected:
            mismatch(DCP_LOCAL_SEQ_LENS, rows, expected, local.tolist(),
                     f"DCP LOCAL SEQ LENS: tokens of each sequence stored on DCP rank {dcp_rank}")
    return out


def _check_slot_mappings(config: RunnerConfig, tracker: BlockTracker, batch: GlobalBatch,
                         mapping: np.ndarray, dcp_rank: int, mismatch: Callable[..., None]) -> None:
    """Rules SLOT, PADDED TOKENS and PCP GATHERED; findings go to ``mismatch``."""
    num_groups = tracker.num_groups
    if mapping.ndim != 2 or mapping.shape[0] != num_groups:
        mismatch(SLOT_MAPPINGS, (), f"[{num_groups}, num_tokens]", list(mapping.shape),
                 "one slot mapping row per KV-cache group")
        return
    num_tokens = int(batch.query_start_loc[-1])
    token_req = [r for i, r in enumerate(batch.req_ids)
                 for _ in range(int(batch.query_start_loc[i + 1] - batch.query_start_loc[i]))]
    for group in range(num_groups):
        row = mapping[group].tolist()
        expected = _token_slots(config, tracker, batch, group, dcp_rank)
        if config.pcp_size > 1:
            if None in expected or len(row) % config.pcp_size:
                continue  # blocks missing from the trace / a layout pcp.py reports
            want = Counter(s for s in expected if s != PAD_SLOT_ID)
            got = Counter(s for s in row if s != PAD_SLOT_ID)
            if want != got:
                mismatch(SLOT_MAPPINGS, (), sorted(want.elements()), sorted(got.elements()),
                         "PCP GATHERED: each global token's slot written exactly once, PAD elsewhere")
            continue
        if len(row) < num_tokens:
            mismatch(SLOT_MAPPINGS, (), f"[{num_groups}, >= {num_tokens}]", list(mapping.shape),
                     "a slot for every token of the batch")
            continue
        for t, want_slot in enumerate(expected):
            if want_slot is not None and row[t] != want_slot:
                shown = [s if s is not None else "?" for s in expected]
                mismatch(SLOT_MAPPINGS, (token_req[t],), shown, row[:num_tokens],
                         f"SLOT: token {t} (position {int(batch.positions[t])} of {token_req[t]})")
                break
        tail = row[num_tokens:]
        if any(s != PAD_SLOT_ID for s in tail):
            mismatch(SLOT_MAPPINGS, (), [PAD_SLOT_ID] * len(tail), tail,
                     f"PADDED TOKENS: slots past the batch's {num_tokens} tokens are PAD_SLOT_ID")
