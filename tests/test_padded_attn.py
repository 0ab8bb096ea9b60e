"""Padding on every path (simrig/graph_rules/padded_attn.py), on hand-built observations, and the
stateful machine's large-then-small order (strategies/steps.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simrig.graph_rules.padded_attn import check_dummy_attn, check_dummy_shape, check_padded_shapes
from simrig.ledger.evidence import RULES
from simrig.observe import CAPTURE, DUMMY, PREPARE, FieldObs, StageObs
from simrig.step import RunnerConfig
from strategies.machine import SchedulerContractMachine
from strategies.model import SchedulerModel
from strategies.steps import draw_large_plan, draw_small_plan

CONFIG = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=32, max_model_len=64)


def _arr(values, dtype=np.int32) -> FieldObs:
    a = np.asarray(values, dtype=dtype)
    return FieldObs("torch", a.dtype.name, a.shape, a)


def _sc(value) -> FieldObs:
    return FieldObs("none", "", (), None) if value is None else FieldObs("scalar", "", (), value)


def _dummy(stage: str, q: list[int], table, slots, computed=None, **desc) -> StageObs:
    fields = {"num_scheduled_tokens": _arr(q), "num_tokens": _sc(sum(q)),
              "attn.block_tables.0": _arr(table), "attn.slot_mappings": _arr(slots, np.int64),
              "num_computed_tokens_np": _arr(computed if computed is not None else [0] * len(q))}
    fields.update({f"desc.{k}": _sc(v) for k, v in desc.items()})
    return StageObs(stage=stage, fields=fields)


def _rules(findings) -> list[str]:
    return [f.message.split(":")[0] for f in findings]


def test_a_clean_dummy_passes():
    stage = _dummy(DUMMY, [2, 2], [[0, 0], [0, 0]], [[-1, -1, -1, -1, -1]])
    assert check_dummy_attn(0, CONFIG, stage) == []


@pytest.mark.parametrize("stage_name", [DUMMY, CAPTURE])
def test_stale_dummy_rows_and_slots_are_found(stage_name):
    stage = _dummy(stage_name, [2, 2], [[0, 0], [7, 8]], [[5, 6, -1, -1]])
    found = check_dummy_attn(3, CONFIG, stage)
    assert _rules(found) == ["DUMMY NULL ROWS", "DUMMY PAD SLOTS"]
    assert found[0].field == "attn.block_tables.0" and found[0].actual == "[7, 8]"
    assert found[1].actual == "2 of 4 set (first 5)"
    assert all(f.check == "padding" and f.stage == stage_name for f in found)


def test_rows_given_context_are_not_judged_and_a_short_mapping_is():
    # set_dummy_context (DCP FULL capture) gives row 1 context: its blocks are allowed
    stage = _dummy(CAPTURE, [2, 2], [[0, 0], [3, 4]], [[-1, -1, -1]], computed=[0, 2])
    assert _rules(check_dummy_attn(0, CONFIG, stage)) == ["DUMMY PAD SLOTS"]


def test_real_step_shapes_follow_the_padded_counts():
    fields = {"num_reqs_after_padding": _sc(4), "num_tokens_after_padding": _sc(8),
              "attn.block_tables.0": _arr(np.zeros((2, 3))), "attn.slot_mappings": _arr(np.full((1, 5), -1))}
    found = check_padded_shapes(1, CONFIG, StageObs(stage=PREPARE, fields=fields))
    assert [(f.field, f.expected, f.actual) for f in found] == [
        ("attn.block_tables.0", "[4, max_num_blocks]", "[2, 3]"),
        ("attn.slot_mappings", "[num_kv_cache_groups, 8]", "[1, 5]")]
    fields["attn.block_tables.0"], fields["attn.slot_mappings"] = _arr(np.zeros((4, 3))), _arr(np.full((1, 8), -1))
    assert check_padded_shapes(1, CONFIG, StageObs(stage=PREPARE, fields=fields)) == []


def test_uniform_idle_dummy_and_mixed_full_bound():
    idle = _dummy(DUMMY, [2, 3], [[0], [0]], [[-1] * 5], uniform_token_count=2)
    assert _rules(check_dummy_shape(0, idle)) == ["UNIFORM DUMMY"]
    capture = _dummy(CAPTURE, [1] * 4, [[0]] * 4, [[-1] * 4], cg_mode="FULL", num_tokens=4)
    capture.fields["max_query_len"] = _sc(2)
    assert _rules(check_dummy_shape(0, capture)) == ["MIXED FULL BOUND"]
    capture.fields["max_query_len"] = _sc(4)
    assert check_dummy_shape(0, capture) == []
    capture.fields["desc.max_query_len"] = _sc(1)  # a varlen decode graph: its own bound holds
    capture.fields["max_query_len"] = _sc(1)
    assert check_dummy_shape(0, capture) == []


def test_an_unset_mixed_full_bound_promises_the_dummys_own_split():
    """max_query_len None is "set when a descriptor promises a query length this batch's own
    split does not reach": unset, a dummy of one token per request promises 1, not "any"."""
    capture = _dummy(CAPTURE, [1] * 4, [[0]] * 4, [[-1] * 4], cg_mode="FULL", num_tokens=4)
    capture.fields["max_query_len"] = _sc(None)
    found = check_dummy_shape(0, capture)
    assert _rules(found) == ["MIXED FULL BOUND"]
    assert (found[0].expected, found[0].actual) == (">= 4", "None (its own longest query 1)")
    assert found[0].extra["pattern"] == "unset_bound_below_graph_tokens"
    capture.fields["max_query_len"] = _sc(3)  # a set bound that is too short has no pattern
    assert "pattern" not in check_dummy_shape(0, capture)[0].extra
    unsplit = _dummy(CAPTURE, [4], [[0]], [[-1] * 4], cg_mode="FULL", num_tokens=4)
    unsplit.fields["max_query_len"] = _sc(None)  # one request of 4 tokens: its split reaches 4
    assert check_dummy_shape(0, unsplit) == []
    del capture.fields["max_query_len"]  # not observed: not judged
    assert check_dummy_shape(0, capture) == []


def test_each_rule_cites_a_vllm_line():
    for key in ("attn_rows", "attn_slots", "dummy_null_rows", "dummy_context", "dummy_pad_slots",
                "mixed_full_query"):
        assert RULES[key].file.startswith("v1/worker/gpu/") and RULES[key].text


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_large_then_small(data):
    """The large plan fills the budget or the slots; the small one is one request."""
    config = RunnerConfig(max_num_reqs=3, max_num_batched_tokens=16, max_model_len=64,
                          num_speculative_tokens=data.draw(st.integers(0, 2)))
    model = SchedulerModel(config)
    for _ in range(data.draw(st.integers(1, 5))):
        model.arrive(data.draw(st.integers(1, 20)), data.draw(st.integers(1, 6)))
    large = draw_large_plan(data.draw, model)
    assert large is not None
    planned = {row.req_id for row in large.rows}
    left_waiting = [r for r in model.waiting() if r.req_id not in planned]
    step = model.build_step(large)
    # every request it could take: the budget is spent, the slots are full, or none is left
    assert step.total_num_scheduled_tokens == 16 or not left_waiting or \
        len(model.held()) + len(model.pending_finished) == 3
    small = draw_small_plan(data.draw, model)
    if small is not None:
        assert len(small.rows) == 1 and small.rows[0].num_tokens <= 1 + config.num_speculative_tokens
        model.build_step(small)


def test_the_machine_has_the_rule():
    assert hasattr(SchedulerContractMachine, "large_then_small")
