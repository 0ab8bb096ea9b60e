"""More than one KV cache group: the trace config states the groups, the strategies
allocate per group like vLLM's per-group managers, the oracle judges each group's
block table and slot mapping, and the real BlockTables agrees (pinned, hand-computed
values)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from simrig.findings import findings as fk
from simrig.observe import PREPARE, StageObs
from simrig.reference.blocks import PAD_SLOT_ID, BlockTracker, below_window, check_attn_blocks
from simrig.step import CachedUpdate, KvGroup, NewRequest, RunnerConfig, Step, block_groups
from simrig.trace_io.trace import TraceError, TraceHeader, read_trace, write_trace
from strategies import kv_group_lists, runner_configs, scheduled_runs
from strategies.blocks import BlockPool
from simrig.reference.comparer import short
from tests.test_blocks import _arr, _batch

FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
P = PAD_SLOT_ID
SWA = KvGroup("sliding_window", window=6, block_size=8)

# Group 0: full attention, block size 4; group 1: sliding window 6, block size 8.
# a: 17 computed, 2 scheduled (positions 17, 18); b: 0 computed, 3 scheduled.
#   group 0  a [3, 7, 9, 11, 13]: p17 -> 13*4 + 1 = 53, p18 -> 54;  b [2]: 8, 9, 10
#   group 1  a [5, 6, 12]:        p17 -> 12*8 + 1 = 97, p18 -> 98;  b [4]: 32, 33, 34
#   a's window: max(0, 17 - (6 - 1)) // 8 = 1 entry below it (block 5 may be reused)
TWO = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16, max_model_len=32, block_size=4,
                   kv_groups=(KvGroup(), SWA))
TWO_BATCH = [("a", 17, 2), ("b", 0, 3)]
TWO_BLOCKS = {"a": [[3, 7, 9, 11, 13], [5, 6, 12]], "b": [[2], [4]]}
TABLE_0 = [[3, 7, 9, 11, 13, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0, 0], [0] * 8]
TABLE_1_NULLED = [[0, 6, 12, 0], [4, 0, 0, 0], [0, 0, 0, 0]]
TABLE_1_AS_SENT = [[5, 6, 12, 0], [4, 0, 0, 0], [0, 0, 0, 0]]
SLOTS = [[53, 54, 8, 9, 10, P, P, P], [97, 98, 32, 33, 34, P, P, P]]


def _stage(tables: list, slots: list) -> StageObs:
    fields = {f"attn.block_tables.{g}": _arr(t, np.int32) for g, t in enumerate(tables)}
    fields["attn.slot_mappings"] = _arr(slots, np.int64)
    return StageObs(PREPARE, fields=fields)


def _tracker() -> BlockTracker:
    tracker = BlockTracker(2)
    tracker.apply(Step(new_requests=[NewRequest(r, 64, block_ids=b) for r, b in TWO_BLOCKS.items()]))
    return tracker


def _check(tables: list, slots: list):
    return check_attn_blocks(TWO, _tracker(), 0, _stage(tables, slots), _batch(TWO_BATCH))


def test_below_window_counts_whole_blocks_of_sliding_window_groups_only():
    assert [below_window(TWO, 1, c) for c in (0, 5, 12, 13, 20, 21)] == [0, 0, 0, 1, 1, 2]
    assert below_window(TWO, 0, 100) == 0  # full attention keeps every block


def test_a_clean_two_group_batch_has_no_findings():
    assert _check([TABLE_0, TABLE_1_NULLED], SLOTS) == []


def test_below_window_entries_kept_as_sent_are_one_named_form_on_every_release():
    """One meaning on every release: the entries below the window are null. Kept as
    sent (0.30.0-0.32.0, or window 1 on 0.33.0) is a mismatch with the pattern the
    known findings name; any other wrong entry carries no pattern."""
    found = _check([TABLE_0, TABLE_1_AS_SENT], SLOTS)
    assert [(f.kind, f.field, f.req_ids, f.extra.get("pattern")) for f in found] == [
        (fk.VALUE_MISMATCH, "attn.block_tables.1", ("a",), "below_window_kept:window=6")]
    assert (found[0].expected, found[0].actual) == (short([0, 6, 12]), short([5, 6, 12]))
    other = [list(r) for r in TABLE_1_NULLED]
    other[0][0] = 9  # neither null nor the id sent
    found = _check([TABLE_0, other], SLOTS)
    assert [(f.field, f.extra.get("pattern")) for f in found] == [("attn.block_tables.1", None)]


def test_each_group_is_judged_on_its_own_block_size():
    slots = [list(SLOTS[0]), list(SLOTS[1])]
    slots[1][0] = 13 * 8 + 1  # group 0's block at group 1's size
    found = _check([TABLE_0, TABLE_1_NULLED], slots)
    assert [(f.field, f.message.split(":")[0]) for f in found] == [("attn.slot_mappings", "SLOT")]
    stale = [list(r) for r in TABLE_1_NULLED]
    stale[2][0] = 5  # a padded row of group 1 keeps a block
    found = _check([TABLE_0, stale], SLOTS)
    assert [(f.field, f.message.split(":")[0]) for f in found] == [("attn.block_tables.1", "PADDED ROWS")]


def test_tracker_keeps_one_list_per_group():
    tracker = BlockTracker(2)
    tracker.apply(Step(new_requests=[NewRequest("a", 8, block_ids=[[1, 2], [3]])]))
    tracker.apply(Step(cached=[CachedUpdate("a", 8, new_block_ids=[[], [4]])]))
    assert (tracker.of("a", 0), tracker.of("a", 1)) == ([1, 2], [3, 4])
    tracker.apply(Step(cached=[CachedUpdate("a", 0, new_block_ids=[[5], [6]], resumed=True)]))
    assert (tracker.of("a", 0), tracker.of("a", 1)) == ([5], [6])
    assert block_groups([7, 8], 2) == [[7, 8], []]  # a flat list is group 0's


# ------------------------------------------------------------------ the pool
def test_pool_frees_blocks_below_the_window_and_shares_only_live_hits():
    config = RunnerConfig(max_num_reqs=2, max_num_batched_tokens=16, max_model_len=16, block_size=4,
                          kv_groups=(KvGroup(), KvGroup("sliding_window", window=4)))
    pool = BlockPool(config)
    assert pool.num_blocks == 1 + 2 * (4 + 4)
    assert pool.admit("r0", 6) == [[1, 2], [3, 4]]  # group by group, fresh ids in order
    assert pool.grow("r0", 9, num_computed=6) == [[5], [6]]  # 6 - 4 + 1 = 3 skipped: no whole block
    assert pool.grow("r0", 12, num_computed=9) == [[], []]  # 6 skipped: block 3 freed
    # 9 skipped: block 4 freed (then the null stops the walk); 4 and 3 are reused first
    assert pool.grow("r0", 13, num_computed=12) == [[4], [3]]
    assert pool.held["r0"] == [[1, 2, 5, 4], [0, 0, 6, 3]]
    # an 8-token hit: group 0 shares r0's [1, 2]; group 1 skips (8 - 3) // 4 = 1 block and
    # needs r0's block 1, which r0 freed: a fresh one
    assert pool.admit("r1", 8, prefix_hit_tokens=8) == [[1, 2], [0, 7]]
    pool.release("r0")  # group 0 frees 4, 5 (1, 2 stay r1's); then group 1 frees 3, 6
    assert pool.admit("r2", 4) == [[3], [6]]


def _life(config: RunnerConfig, steps: list[Step]):
    """Yields (step, runner rows per group, the first index the scheduler still
    holds per group, computed) from the steps alone."""
    groups = config.num_kv_groups
    rows: dict[str, list[list[int]]] = {}
    low: dict[str, list[int]] = {}
    computed: dict[str, int] = {}
    for step in steps:
        for r in (*step.finished, *step.preempted):
            rows.pop(r, None)
            low.pop(r, None)
        for req in step.new_requests:
            rows[req.req_id] = block_groups(req.block_ids, groups)
            computed[req.req_id] = req.num_computed_tokens
        for upd in step.cached:
            for held, new in zip(rows[upd.req_id], block_groups(upd.new_block_ids, groups)):
                held.extend(new)
            computed[upd.req_id] = upd.num_computed_tokens
        for req_id in step.num_scheduled_tokens:
            low[req_id] = [below_window(config, g, computed[req_id]) for g in range(groups)]
        yield step, rows, low, computed


def _multi_group_configs():
    return runner_configs(max_num_reqs=st.integers(1, 3), max_num_batched_tokens=st.just(16),
                          max_model_len=st.just(64), block_size=st.just(4), pcp_sizes=st.just(1),
                          dcp_without_pcp=st.just(False),  # sliding windows need DCP 1
                          kv_groups=kv_group_lists(max_window=12).filter(lambda g: len(g) > 1))


@FAST
@given(scheduled_runs(config=_multi_group_configs(), max_steps=14))
def test_generated_groups_cover_the_tokens_and_never_share_a_held_block(run):
    config, steps = run
    for step, rows, low, computed in _life(config, steps):
        for req_id, n in step.num_scheduled_tokens.items():
            for g, row in enumerate(rows[req_id]):
                span = config.group_block_size(g)
                needed = row[low[req_id][g]:-(-(computed[req_id] + n) // span)]
                assert len(row) * span >= computed[req_id] + n, "blocks cover every scheduled token"
                assert 0 not in needed, "every block a scheduled token reads is a real one"
        owners: dict[int, set[tuple[str, int, int]]] = {}
        for req_id, groups in rows.items():
            for g, row in enumerate(groups):
                for i in range(low[req_id][g], len(row)):
                    if row[i]:
                        owners.setdefault(row[i], set()).add((req_id, g, i))
        for block, held in owners.items():  # only a prefix hit shares: same group, same place
            assert len({(g, i) for _, g, i in held}) == 1, (block, held)


def test_multi_kv_groups_draws_three_groups_with_a_sliding_window():
    opts = settings(database=None, max_examples=1000, suppress_health_check=list(HealthCheck))
    config = find(runner_configs(multi_kv_groups=st.just(True)),
                  lambda c: any(g.kind == "sliding_window" for g in c.kv_groups) and c.num_kv_groups == 3,
                  settings=opts)
    assert config.pcp_size == config.dcp_size == 1 and config.kv_groups[0] == KvGroup()


@FAST
@given(runner_configs(pcp_sizes=st.sampled_from((1, 2)), dcp_without_pcp=st.booleans(),
                      multi_kv_groups=st.booleans()))
def test_no_sliding_window_group_is_drawn_under_context_parallelism(config):
    if config.pcp_size > 1 or config.dcp_size > 1:
        assert all(g.kind == "full" for g in config.kv_groups)


@FAST
@given(runner_configs(multi_kv_groups=st.just(False)))
def test_one_full_group_without_multi_kv_groups(config):
    assert config.kv_groups == (KvGroup(),)


def test_campaign_configs_draw_several_groups_by_default():
    config = find(runner_configs(), lambda c: c.num_kv_groups > 1,
                  settings=settings(database=None, suppress_health_check=list(HealthCheck)))
    assert 2 <= config.num_kv_groups <= 3


def test_sliding_window_is_refused_with_dcp():
    with pytest.raises(ValueError, match=r"kv_groups\[1\].kind: .*without PCP and DCP"):
        RunnerConfig(pcp_size=2, dcp_size=2, kv_groups=(KvGroup(), SWA)).validate()


# ------------------------------------------------------------------ trace format
def test_trace_round_trip_keeps_groups_and_per_group_blocks(tmp_path: Path):
    steps = [Step(new_requests=[NewRequest("a", 8, block_ids=[[1, 2], [0, 3]])], num_scheduled_tokens={"a": 8}),
             Step(cached=[CachedUpdate("a", 8, new_block_ids=[[4], []])], num_scheduled_tokens={"a": 1})]
    path = tmp_path / "two.jsonl"
    write_trace(path, TraceHeader(config=TWO), steps)
    header_line = json.loads(path.read_text().splitlines()[0])
    assert header_line["config"]["kv_groups"] == [{"kind": "full"},
                                                  {"kind": "sliding_window", "window": 6, "block_size": 8}]
    header, read = read_trace(path)
    assert header.config == TWO
    assert read[0].new_requests[0].block_ids == [[1, 2], [0, 3]]
    assert read[1].cached[0].new_block_ids == [[4], []]
    write_trace(path, TraceHeader(), [])  # one full group: the key is not written
    assert "kv_groups" not in path.read_text()


BAD = [
    ({"kv_groups": []}, "config.kv_groups: must be a non-empty list"),
    ({"kv_groups": [{"kind": "local"}]}, "config.kv_groups[0].kind: must be one of full, sliding_window"),
    ({"kv_groups": [{"kind": "full", "size": 4}]}, "config.kv_groups[0].size: unknown field"),
    ({"kv_groups": [{"kind": "sliding_window"}]}, "config.kv_groups[0].window: a sliding_window group needs"),
    ({"kv_groups": [{"kind": "full", "block_size": 0}]}, "config.kv_groups[0].block_size: must be >= 1"),
    ({"kv_groups": [{"kind": "full", "window": 4}]}, "config.kv_groups[0].window: only a sliding_window"),
]


@pytest.mark.parametrize("config, message", BAD)
def test_bad_kv_groups_name_file_line_and_field(tmp_path: Path, config, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"format": "simrig-trace", "version": 1, "config": config}) + "\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value).startswith(f"{path}:1: {message}")


@pytest.mark.parametrize("blocks, message", [
    ([1, 2], "new_requests[0].block_ids: must be one list per KV cache group (2 groups)"),
    ([[1, 2]], "new_requests[0].block_ids: has 1 lists, the config has 2 KV cache group(s)"),
    ([[1], 2], "new_requests[0].block_ids: must be a list of integers or a list of lists, not a mix"),
])
def test_block_ids_must_name_each_group(tmp_path: Path, blocks, message):
    path = tmp_path / "bad.jsonl"
    header = {"format": "simrig-trace", "version": 1, "config": {"kv_groups": [{"kind": "full"}, {"kind": "full"}]}}
    step = {"new_requests": [{"id": "a", "prompt_len": 4, "block_ids": blocks}], "num_scheduled_tokens": {"a": 4}}
    path.write_text(json.dumps(header) + "\n" + json.dumps(step) + "\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == f"{path}:2: {message}"


# ------------------------------------------------------------------ real vLLM agrees
def _known_here(finding) -> bool:
    """Whether the installed release's known findings explain ``finding``."""
    from simrig.findings.known import installed_vllm_version, load_known_findings

    return load_known_findings(installed_vllm_version()).judge(finding) is not None


@pytest.mark.vllm
def test_real_two_group_block_tables_give_the_pinned_values(vllm_api):
    """The installed BlockTables built for TWO (wiring.block_tables), called as
    prepare_attn calls it, gives the hand-computed tables and slots."""
    tables = vllm_api.build_block_tables(TWO)
    for slot, req in enumerate(("a", "b")):
        tables.append_block_ids(slot, tuple(TWO_BLOCKS[req]), overwrite=True)
    tables.apply_staged_writes()
    idx = torch.tensor([0, 1], dtype=torch.int32)
    nulls = vllm_api.shape.nulls_below_window
    computed = torch.zeros(TWO.max_num_reqs, dtype=torch.int32)
    computed[0] = 17
    # prepare_attn passes the computed counts where the release nulls below the window
    extra = {"num_computed_tokens": computed} if nulls else {}
    gathered = tables.gather_block_tables(idx, num_reqs_padded=3, **extra)
    batch = _batch(TWO_BATCH)
    positions = torch.zeros(TWO.max_num_batched_tokens, dtype=torch.int64)
    positions[:5] = torch.from_numpy(batch.positions)
    slots = tables.compute_slot_mappings(idx, torch.from_numpy(batch.query_start_loc).to(torch.int32),
                                         positions, num_tokens_padded=8)
    assert gathered[0].tolist() == TABLE_0
    assert gathered[1].tolist() == (TABLE_1_NULLED if nulls else TABLE_1_AS_SENT)
    assert slots.tolist() == SLOTS
    # one meaning on every release: a release that keeps the entries is held to it, and
    # the finding is the one its known finding names
    found = _check([t.numpy() for t in gathered], slots.numpy())
    assert [f.extra.get("pattern") for f in found] == ([] if nulls else ["below_window_kept:window=6"])
    assert all(_known_here(f) for f in found)


@pytest.mark.vllm
@settings(max_examples=3, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(run=scheduled_runs(config=_multi_group_configs(), min_steps=4, max_steps=10))
def test_real_runs_with_several_groups_have_no_block_findings(vllm_api, run):
    """Generated multi-group runs through the real execute_model: the blocks
    oracle finds nothing the installed release's known findings do not explain."""
    from simrig.checks.checker import Checker
    from simrig.harness import Harness

    config, steps = run
    harness = Harness(config, api=vllm_api)
    checker = Checker(config)
    for index, step in enumerate(steps):
        found = [f for f in checker.check(index, step, harness.run_step(step))
                 if f.check == "blocks" and not f.known]
        assert found == [], [f.one_line() for f in found]


SLIDING_TRACE = Path(__file__).parent / "fixtures" / "sliding_window_groups.jsonl"


@pytest.mark.vllm
def test_a_sliding_window_trace_through_execute_model_gives_the_pinned_tables(vllm_api):
    """tests/fixtures/sliding_window_groups.jsonl (window 5, block size 4): at step 3
    request a (13 computed) holds [3, 4, 7, 10] in the sliding-window group; its
    first (13 - 4) // 4 = 2 entries are below the window (blocks 3 and 4 were freed
    and reused by the full group). c, new, holds [8, 5]; slots by hand:
      group 0  a p13 -> 4*4 + 1 = 17;  c [9, 6] p0..5 -> 36 37 38 39 24 25
      group 1  a p13 -> 10*4 + 1 = 41; c [8, 5] p0..5 -> 32 33 34 35 20 21"""
    from simrig.checks.checker import Checker
    from simrig.harness import Harness

    header, steps = read_trace(SLIDING_TRACE)
    nulls = vllm_api.shape.nulls_below_window
    harness = Harness(header.config, api=vllm_api)
    checker = Checker(header.config)
    kept = []
    for index, step in enumerate(steps):
        obs = harness.run_step(step)
        found = [f for f in checker.check(index, step, obs) if f.check == "blocks"]
        assert [f.one_line() for f in found if not f.known] == []
        kept += [(index, f.field, f.extra.get("pattern")) for f in found]
    # a release that keeps the entries below the window shows it, as its known finding
    assert kept == ([] if nulls else [(3, "attn.block_tables.1", "below_window_kept:window=5")])
    prepare = obs.get(PREPARE).fields
    assert prepare["attn.block_tables.1"].values[:2, :4].tolist() == [
        [0, 0, 7, 10] if nulls else [3, 4, 7, 10], [8, 5, 0, 0]]
    assert prepare["attn.slot_mappings"].values[:, :7].tolist() == [[17, 36, 37, 38, 39, 24, 25],
                                                                  [41, 32, 33, 34, 35, 20, 21]]
