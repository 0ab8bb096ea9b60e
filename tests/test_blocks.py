"""Block ids: the strategies allocate them like a block pool; the oracle judges
block tables and slot mappings from their meaning (pinned, hand-computed values)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from simrig.findings import findings as fk
from simrig.observe import PREPARE, FieldObs, StageObs
from simrig.reference.blocks import (
    PAD_SLOT_ID,
    BlockTracker,
    check_attn_blocks,
    dcp_local_seq_len,
    expected_slot,
)
from simrig.reference.reference import GlobalBatch
from simrig.step import CachedUpdate, KvGroup, NewRequest, RunnerConfig, Step
from strategies import runner_configs, scheduled_runs
from strategies.blocks import BlockPool

# one full-attention group (several: tests/test_kv_groups.py)
ONE_GROUP = st.just((KvGroup(),))
FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
P = PAD_SLOT_ID


def _arr(values, dtype) -> FieldObs:
    a = np.array(values, dtype=dtype)
    return FieldObs("torch", str(a.dtype), a.shape, a)


def _stage(tables=None, slots=None, dcp_local=None, dcp_rank=0) -> StageObs:
    fields = {}
    if tables is not None:
        fields["attn.block_tables.0"] = _arr(tables, np.int32)
    if slots is not None:
        fields["attn.slot_mappings"] = _arr(slots, np.int64)
    if dcp_local is not None:
        fields["dcp_local_seq_lens"] = _arr(dcp_local, np.int32)
    return StageObs(PREPARE, dcp_rank=dcp_rank, fields=fields)


def _batch(rows: list[tuple[str, int, int]]) -> GlobalBatch:
    """rows: (req_id, num_computed, query_len) in batch order."""
    q = np.array([r[2] for r in rows])
    nc = np.array([r[1] for r in rows])
    positions = np.concatenate([np.arange(c, c + n) for _, c, n in rows])
    return GlobalBatch([r[0] for r in rows], q, nc < 0, np.concatenate([[0], np.cumsum(q)]),
                       positions, np.zeros_like(positions), np.arange(len(rows)), nc)


def _tracker(blocks: dict[str, list[int]]) -> BlockTracker:
    tracker = BlockTracker()
    tracker.apply(Step(new_requests=[NewRequest(r, 64, block_ids=b) for r, b in blocks.items()]))
    return tracker


# Two requests, block size 4: a holds [3, 7] and computes positions 2..4,
# b holds [5] and computes positions 0..1; 3 rows, 8 tokens after padding.
#   a: p2 -> 3*4+2 = 14, p3 -> 15, p4 -> 7*4+0 = 28;   b: p0 -> 5*4 = 20, p1 -> 21
PLAIN = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16, max_model_len=16, block_size=4)
PLAIN_BATCH = [("a", 2, 3), ("b", 0, 2)]
PLAIN_BLOCKS = {"a": [3, 7], "b": [5]}
PLAIN_TABLES = [[3, 7, 0, 0], [5, 0, 0, 0], [0, 0, 0, 0]]
PLAIN_SLOTS = [[14, 15, 28, 20, 21, P, P, P]]

# DCP 2, block size 4: one block id spans 8 tokens; c holds [2, 9] and
# computes positions 5..8 (seq_len 9). Token p lives on rank p % 2.
#   rank 0: p5 PAD, p6 -> 2*4 + |{0,2,4}| = 11, p7 PAD, p8 -> 9*4 + 0 = 36
#   rank 1: p5 -> 2*4 + |{1,3}| = 10, p6 PAD, p7 -> 2*4 + |{1,3,5}| = 11, p8 PAD
#   local seq lens: rank 0 holds {0,2,4,6,8} = 5, rank 1 {1,3,5,7} = 4
DCP = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16, max_model_len=16, block_size=4, dcp_size=2)
DCP_SLOTS = {0: [P, 11, P, 36, P, P], 1: [10, P, 11, P, P, P]}
DCP_LOCAL = {0: [5, 0], 1: [4, 0]}


def test_pinned_slots_and_local_seq_lens():
    assert [expected_slot([3, 7], p, 4) for p in (2, 3, 4)] == [14, 15, 28]
    assert [expected_slot([2, 9], p, 4, 2, 0) for p in (5, 6, 7, 8)] == [P, 11, P, 36]
    assert [expected_slot([2, 9], p, 4, 2, 1) for p in (5, 6, 7, 8)] == [10, P, 11, P]
    assert expected_slot([2], 8, 4, 2, 0) is None  # the blocks do not reach position 8
    assert (dcp_local_seq_len(9, 2, 0), dcp_local_seq_len(9, 2, 1)) == (5, 4)


def test_a_clean_plain_batch_has_no_findings():
    stage = _stage(PLAIN_TABLES, PLAIN_SLOTS)
    assert check_attn_blocks(PLAIN, _tracker(PLAIN_BLOCKS), 0, stage, _batch(PLAIN_BATCH)) == []


@pytest.mark.parametrize("rank", [0, 1])
def test_a_clean_dcp_batch_has_no_findings(rank):
    stage = _stage([[2, 9, 0, 0], [0, 0, 0, 0]], [DCP_SLOTS[rank]], DCP_LOCAL[rank], dcp_rank=rank)
    assert check_attn_blocks(DCP, _tracker({"c": [2, 9]}), 0, stage, _batch([("c", 5, 4)])) == []


def test_entries_past_a_requests_blocks_are_not_judged():
    tables = [[3, 7, 99, 98], [5, 97, 0, 0], [0, 0, 0, 0]]  # stale entries past n_i
    stage = _stage(tables, PLAIN_SLOTS)
    assert check_attn_blocks(PLAIN, _tracker(PLAIN_BLOCKS), 0, stage, _batch(PLAIN_BATCH)) == []


CORRUPTIONS = {
    "row": (lambda t, s: t[1].__setitem__(0, 6), "attn.block_tables.0", "ROWS"),
    "padded row": (lambda t, s: t[2].__setitem__(1, 4), "attn.block_tables.0", "PADDED ROWS"),
    "slot": (lambda t, s: s[0].__setitem__(2, 29), "attn.slot_mappings", "SLOT"),
    "padded token": (lambda t, s: s[0].__setitem__(6, 0), "attn.slot_mappings", "PADDED TOKENS"),
    "rows swapped": (lambda t, s: t.__setitem__(slice(0, 2), [t[1], t[0]]), "attn.block_tables.0", "ROWS"),
}


def test_rows_past_the_handed_rows_that_hold_block_ids_are_reported():
    """ROWS PAST: the shared table's rows past the three handed over must be null; rows 4
    and 6 keeping a larger earlier batch's ids are named, an empty list passes."""
    clean = _stage(PLAIN_TABLES, PLAIN_SLOTS)
    clean.fields["attn.filled_rows_past.0"] = _arr([], np.int64)
    assert check_attn_blocks(PLAIN, _tracker(PLAIN_BLOCKS), 0, clean, _batch(PLAIN_BATCH)) == []
    stale = _stage(PLAIN_TABLES, PLAIN_SLOTS)
    stale.fields["attn.filled_rows_past.0"] = _arr([4, 6], np.int64)
    found = check_attn_blocks(PLAIN, _tracker(PLAIN_BLOCKS), 2, stale, _batch(PLAIN_BATCH))
    assert [(f.kind, f.field, f.expected, f.actual) for f in found] == [
        (fk.VALUE_MISMATCH, "attn.filled_rows_past.0", "[]", "[4, 6]")]
    assert found[0].message.startswith("ROWS PAST")


def test_filled_rows_past_reads_the_shared_buffer_behind_the_view():
    import torch

    from simrig.adapters.probes import filled_rows_past

    buffer = torch.zeros(6, 4, dtype=torch.int32)
    buffer[1, 0], buffer[3, 2], buffer[5, 1] = 7, 9, 4
    assert filled_rows_past(buffer[:3]).tolist() == [3, 5]
    assert filled_rows_past(buffer[:6]).tolist() == []
    assert filled_rows_past(buffer) is None  # the whole buffer: nothing past it
    assert filled_rows_past(buffer[1:3]) is None  # not the head of the buffer


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_each_rule_reports_a_corruption(corruption):
    corrupt, field, rule = CORRUPTIONS[corruption]
    tables, slots = [list(r) for r in PLAIN_TABLES], [list(r) for r in PLAIN_SLOTS]
    corrupt(tables, slots)
    found = check_attn_blocks(PLAIN, _tracker(PLAIN_BLOCKS), 3, _stage(tables, slots), _batch(PLAIN_BATCH))
    assert found and all(f.kind == fk.VALUE_MISMATCH and f.step == 3 for f in found)
    assert {f.field for f in found} == {field}
    assert any(f.message.startswith(rule) for f in found)


def test_dcp_rules_report_a_slot_stored_on_the_wrong_rank_and_a_wrong_local_len():
    tracker, batch = _tracker({"c": [2, 9]}), _batch([("c", 5, 4)])
    wrong_rank = _stage([[2, 9, 0, 0]], [DCP_SLOTS[1]], DCP_LOCAL[0], dcp_rank=0)  # rank 1's mapping
    assert [f.field for f in check_attn_blocks(DCP, tracker, 0, wrong_rank, batch)] == ["attn.slot_mappings"]
    wrong_len = _stage([[2, 9, 0, 0]], [DCP_SLOTS[0]], [4, 0], dcp_rank=0)
    assert [f.field for f in check_attn_blocks(DCP, tracker, 0, wrong_len, batch)] == ["dcp_local_seq_lens"]


def test_pcp_gathered_mapping_writes_each_slot_once():
    pcp = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16, max_model_len=16, block_size=4, pcp_size=2)
    tracker, batch = _tracker({"a": [4]}), _batch([("a", 0, 4)])  # slots 16..19
    good = _stage([[4, 0, 0, 0]], [[16, 17, P, P, 18, 19, P, P]])
    assert check_attn_blocks(pcp, tracker, 0, good, batch) == []
    twice = _stage([[4, 0, 0, 0]], [[16, 17, 18, 19, 18, 19, P, P]])
    assert [f.field for f in check_attn_blocks(pcp, tracker, 0, twice, batch)] == ["attn.slot_mappings"]


def test_a_request_without_blocks_in_its_trace_has_its_slots_unjudged():
    stage = _stage([[0, 0, 0, 0]], [[123, 456, P, P]])
    assert check_attn_blocks(PLAIN, _tracker({"a": []}), 0, stage, _batch([("a", 0, 2)])) == []


def test_tracker_overwrites_appends_replaces_and_drops():
    tracker = BlockTracker()
    tracker.apply(Step(new_requests=[NewRequest("a", 8, block_ids=[1, 2]),
                                     NewRequest("b", 8, block_ids=[3])]))
    tracker.apply(Step(cached=[CachedUpdate("a", 8, new_block_ids=[4]), CachedUpdate("b", 8)]))
    assert (tracker.of("a"), tracker.of("b")) == ([1, 2, 4], [3])
    tracker.apply(Step(cached=[CachedUpdate("b", 0, new_block_ids=[9], resumed=True)], finished=["a"]))
    assert (tracker.of("a"), tracker.of("b")) == ([], [9])
    tracker.apply(Step(preempted=["b"], new_requests=[NewRequest("a", 8, block_ids=[5])]))
    assert (tracker.of("a"), tracker.of("b")) == ([5], [])


# ------------------------------------------------------------------ the pool
def test_pool_skips_the_null_block_reuses_tail_first_and_shares_prefix_hits():
    pool = BlockPool(RunnerConfig(max_num_reqs=3, max_num_batched_tokens=16, max_model_len=16, block_size=4))
    assert pool.num_blocks == 1 + 3 * 4
    assert pool.admit("r0", 6) == [1, 2]
    assert pool.admit("r1", 4) == [3]
    assert pool.grow("r1", 5) == [4] and pool.grow("r1", 8) == []
    pool.release("r0")
    assert pool.admit("r2", 9) == [2, 1, 5]  # tail freed first is reused first, then fresh ids
    # A 2-block hit shares the leading blocks of the oldest holder of 2: r1.
    assert pool.admit("r3", 10, prefix_hit_tokens=8) == [3, 4, 6]
    pool.release("r2")
    assert pool.admit("r4", 1) == [5]  # r2's tail, freed first
    pool.release("r3")  # 3 and 4 stay r1's: only 6 returns
    assert pool.admit("r5", 4) == [6]
    pool.release("r1")
    assert pool.admit("r6", 12) == [4, 3, 1]  # r1's tail first, then r2's older frees


def test_pool_blocks_span_dcp_times_block_size():
    pool = BlockPool(RunnerConfig(max_num_reqs=1, max_num_batched_tokens=16, max_model_len=16,
                                  block_size=4, dcp_size=2))
    assert pool.admit("r0", 9) == [1, 2] and pool.num_blocks == 3


def _life(config: RunnerConfig, steps: list[Step]):
    """Replays ``steps`` independently of the pool: yields (step, live blocks, hit blocks)."""
    span = config.block_size * config.dcp_size
    live: dict[str, list[int]] = {}
    hits: dict[str, int] = {}
    computed: dict[str, int] = {}
    for step in steps:
        for r in (*step.finished, *step.preempted):
            live.pop(r, None)
        for req in step.new_requests:
            live[req.req_id] = list(req.block_ids)
            hits[req.req_id] = req.num_computed_tokens // span
            computed[req.req_id] = req.num_computed_tokens
        for upd in step.cached:
            live[upd.req_id] += upd.new_block_ids or []
            computed[upd.req_id] = upd.num_computed_tokens
        yield step, live, hits, computed


@FAST
@given(scheduled_runs(config=runner_configs(dcp_sizes=st.sampled_from((1, 2, 4)), kv_groups=ONE_GROUP),
                     max_steps=12))
def test_generated_blocks_cover_the_tokens_and_are_never_held_twice(run):
    config, steps = run
    span = config.block_size * config.dcp_size
    for step, live, hits, computed in _life(config, steps):
        for req_id, n in step.num_scheduled_tokens.items():
            assert len(live[req_id]) * span >= computed[req_id] + n, "blocks cover every scheduled token"
        owners: dict[int, list[tuple[str, int]]] = {}
        for req_id, blocks in live.items():
            assert 0 not in blocks, "the null block is never allocated"
            assert len(set(blocks)) == len(blocks)
            for i, b in enumerate(blocks):
                owners.setdefault(b, []).append((req_id, i))
        for block, held in owners.items():
            if len(held) > 1:  # only a prefix hit shares, at the same place in every list
                assert len({i for _, i in held}) == 1, (block, held)
                assert sum(i >= hits[r] for r, i in held) <= 1, (block, held)


def _pool_events(run) -> set[str]:
    config, steps = run
    seen: set[str] = set()
    freed: set[int] = set()
    prev: dict[str, list[int]] = {}
    for step, live, hits, _ in _life(config, steps):
        gone = {b for r in (*step.finished, *step.preempted) for b in prev.get(r, [])}
        if gone:
            seen.add("free")
        freed |= gone
        new = [b for q in step.new_requests for b in q.block_ids[hits[q.req_id]:]]
        new += [b for c in step.cached for b in c.new_block_ids or []]
        if any(b in freed for b in new):
            seen.add("reuse")
        if any(c.new_block_ids for c in step.cached):
            seen.add("grow")
        for q in step.new_requests:
            others = {b for r, bl in live.items() if r != q.req_id for b in bl}
            if hits[q.req_id] and q.block_ids[0] in others:
                seen.add("share")
        prev = {r: list(b) for r, b in live.items()}
    return seen


@pytest.mark.parametrize("event", ["free", "reuse", "grow", "share"])
def test_generated_runs_free_reuse_grow_and_share_blocks(event):
    configs = runner_configs(max_num_reqs=st.integers(1, 3), max_num_batched_tokens=st.just(16),
                             max_model_len=st.just(64), pcp_sizes=st.just(1), kv_groups=ONE_GROUP)
    run = find(scheduled_runs(config=configs, min_steps=3, max_steps=10), lambda r: event in _pool_events(r),
               settings=settings(max_examples=3000, database=None, deadline=None,
                                 suppress_health_check=list(HealthCheck),
                                 phases=[Phase.generate]))  # the first drawn: no shrinking
    assert event in _pool_events(run)


def test_dcp_is_drawn_without_pcp():
    config = find(runner_configs(dcp_without_pcp=st.just(True)), lambda c: c.dcp_size > 1 and c.pcp_size == 1,
                  settings=settings(database=None, suppress_health_check=list(HealthCheck)))
    config.validate()
    assert config.dcp_size > 1 and config.pcp_size == 1 and not config.shard_decode_requests


def test_dcp_without_pcp_is_drawn_by_default():
    # seeded: the search is the same on every run, whatever the machine's load
    config = find(runner_configs(), lambda c: c.pcp_size == 1 and c.dcp_size > 1,
                  settings=settings(database=None, suppress_health_check=list(HealthCheck)),
                  random=random.Random(0))
    assert config.dcp_size == 2 and not config.shard_decode_requests
    off = find(runner_configs(dcp_without_pcp=st.just(False)), lambda c: c.pcp_size == 1,
               settings=settings(database=None, suppress_health_check=list(HealthCheck)),
               random=random.Random(0))
    assert off.dcp_size == 1


@FAST
@given(runner_configs())
def test_shard_decode_requests_only_with_pcp_and_without_dcp(config):
    assert not config.shard_decode_requests or (config.pcp_size > 1 and config.dcp_size == 1)


# ------------------------------------------------------------------ real vLLM agrees
def _real_configs(dcp: int):
    return runner_configs(max_num_reqs=st.integers(1, 3), max_num_batched_tokens=st.just(16),
                          max_model_len=st.just(48), block_size=st.just(4), pcp_sizes=st.just(1),
                          dcp_sizes=st.just(dcp), num_speculative_tokens=st.integers(0, 2),
                          kv_groups=ONE_GROUP)


@pytest.mark.vllm
@pytest.mark.parametrize("dcp, rank", [(1, 0), (2, 0), (2, 1)])
@settings(max_examples=4, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_real_block_tables_agree_with_the_oracle(vllm_api, dcp, rank, data):
    """The installed BlockTables (append_block_ids, apply_staged_writes, then
    gather_block_tables / compute_slot_mappings, as prepare_attn calls them) on
    generated block ids: the oracle finds nothing, so the field meanings hold."""
    import torch
    from vllm.v1.worker.gpu.block_table import BlockTables

    config, steps = data.draw(scheduled_runs(config=_real_configs(dcp), min_steps=3, max_steps=8))
    width = -(-config.max_model_len // (config.block_size * config.dcp_size))
    padded_tokens = config.max_num_batched_tokens
    tables = BlockTables([config.block_size], max_num_reqs=config.max_num_reqs + 1,
                         max_num_batched_tokens=padded_tokens, max_num_blocks_per_group=[width],
                         device=torch.device("cpu"), cp_size=config.dcp_size, cp_rank=rank,
                         cp_interleave=1, dcp_sharded=[config.dcp_size > 1])
    tracker, slots, free = BlockTracker(), {}, list(range(config.max_num_reqs + 1))
    computed: dict[str, int] = {}
    for index, step in enumerate(steps):
        tracker.apply(step)
        for r in (*step.finished, *step.preempted):
            free.append(slots.pop(r))
        for req in step.new_requests:
            slots[req.req_id] = free.pop(0)
            computed[req.req_id] = req.num_computed_tokens
            tables.append_block_ids(slots[req.req_id], (list(req.block_ids),), overwrite=True)
        for upd in step.cached:
            computed[upd.req_id] = upd.num_computed_tokens
            if upd.new_block_ids is not None:
                tables.append_block_ids(slots[upd.req_id], (list(upd.new_block_ids),), overwrite=False)
        tables.apply_staged_writes()
        rows = [(r, computed[r], n) for r, n in step.num_scheduled_tokens.items()]
        batch = _batch(rows)
        idx = torch.tensor([slots[r] for r, _, _ in rows], dtype=torch.int32)
        gathered = tables.gather_block_tables(idx, num_reqs_padded=len(rows) + 1)
        positions = torch.zeros(padded_tokens, dtype=torch.int64)
        positions[:len(batch.positions)] = torch.from_numpy(batch.positions)
        mapping = tables.compute_slot_mappings(idx, torch.from_numpy(batch.query_start_loc).to(torch.int32),
                                               positions, num_tokens_padded=padded_tokens)
        stage = _stage(gathered[0].numpy(), mapping.numpy(), dcp_rank=rank)
        assert check_attn_blocks(config, tracker, index, stage, batch) == [], (index, step)
        for r, _, _ in rows:
            computed[r] += step.num_accepted(r)
