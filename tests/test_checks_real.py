"""The checks on real vLLM observations: clean sequences stay clean, corruptions are caught."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from simrig.checks.checker import Checker
from simrig.findings import findings as fk
from simrig.harness import Harness
from simrig.observe import StepObs
from simrig.report.snapshot import scenario_steps
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step

pytestmark = pytest.mark.vllm

BASE = dict(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256, num_speculative_tokens=2)
CONFIGS = {
    "plain": RunnerConfig(**BASE),
    "pcp2": RunnerConfig(**BASE, pcp_size=2),
    "pcp2-shard": RunnerConfig(**BASE, pcp_size=2, shard_decode_requests=True),
    "pcp4": RunnerConfig(**BASE, pcp_size=4),
    "pcp4-shard": RunnerConfig(**BASE, pcp_size=4, shard_decode_requests=True),
    "pcp2-dcp2": RunnerConfig(**BASE, pcp_size=2, dcp_size=2),
}


def clean_steps() -> list[Step]:
    """Fresh + chunked prefill, decode, spec decode with a rejection, preempt and
    resume as new (prefill_len > prompt_len), explicit token ids, prefix hit."""
    return scenario_steps() + [
        Step(preempted=["b"], finished=["c"],
             new_requests=[NewRequest("b", 20, prefill_len=24),
                           NewRequest("d", 6, prompt_token_ids=[11, 12, 13, 14, 15, 16]),
                           NewRequest("e", 30, num_computed_tokens=16)],
             cached=[CachedUpdate("a", 44)],
             num_scheduled_tokens={"a": 1, "b": 24, "d": 6, "e": 14}),
        Step(cached=[CachedUpdate("a", 45), CachedUpdate("b", 24), CachedUpdate("d", 6),
                     CachedUpdate("e", 30)],
             num_scheduled_tokens={"a": 1, "b": 1, "d": 3, "e": 1}, spec_tokens={"d": 2}),
    ]


@pytest.fixture(scope="module")
def runs(vllm_api) -> dict[str, tuple[RunnerConfig, list[Step], list[StepObs]]]:
    out = {}
    for name, config in CONFIGS.items():
        harness = Harness(config, api=vllm_api)
        steps = clean_steps()
        out[name] = (config, steps, [harness.run_step(s) for s in steps])
    return out


def check_all(config: RunnerConfig, steps: list[Step], observations: list[StepObs]) -> list[fk.Finding]:
    checker = Checker(config, trace="test")
    return [f for i, (s, o) in enumerate(zip(steps, observations)) for f in checker.check(i, s, o)]


def mutated(observations: list[StepObs], index: int, fn: Callable[[StepObs], None]) -> list[StepObs]:
    out = list(observations)
    out[index] = copy.deepcopy(observations[index])
    fn(out[index])
    return out


def set_field(obs: StepObs, stage: str, name: str, rank: int | None = None, **changes) -> None:
    st = obs.get(stage, rank)
    st.fields[name] = dataclasses.replace(st.fields[name], **changes)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_clean_sequence_has_only_known_findings(runs, name):
    findings = check_all(*runs[name])
    new = [f.one_line() for f in findings if not f.known]
    assert new == []
    assert all(f.trace == "test" for f in findings)


def test_real_vs_dummy_logits_indices_dtype_is_a_known_finding(runs):
    findings = check_all(*runs["plain"])
    parity = [f for f in findings if f.check == "parity"]
    assert parity and {(f.field, f.expected, f.actual, f.known) for f in parity} == {
        ("logits_indices", "torch int64", "torch int32", True),
        # the dummy batch has no drafts and no prefill, so both stay None (known on 0.33.0)
        ("prefill_runs_as_decode_np", "numpy bool", "None", True),
        ("num_draft_tokens_per_req", "numpy int32", "None", True)}


def test_idx_mapping_int32_is_dtype_drift(runs):
    config, steps, observations = runs["plain"]

    def flip(o: StepObs) -> None:
        f = o.get("prepare").fields["idx_mapping"]
        set_field(o, "prepare", "idx_mapping", dtype="int32", values=f.values.astype(np.int32))

    findings = check_all(config, steps, mutated(observations, 2, flip))
    got = {(f.check, f.kind, f.stage, f.field, f.step) for f in findings if not f.known}
    assert ("contract", fk.DTYPE_DRIFT, "prepare", "idx_mapping", 2) in got
    assert ("parity", fk.DTYPE_DRIFT, "dummy", "idx_mapping", 2) in got
    assert ("drift", fk.DTYPE_DRIFT, "prepare", "idx_mapping", 2) in got
    assert ("drift", fk.DTYPE_DRIFT, "prepare", "idx_mapping", 3) in got  # and back


def test_dummy_shape_mismatch_is_parity_value_mismatch(runs):
    config, steps, observations = runs["plain"]

    def shrink(o: StepObs) -> None:
        f = o.get("dummy").fields["seq_lens"]
        set_field(o, "dummy", "seq_lens", shape=(1,), values=f.values[:1])

    findings = [f for f in check_all(config, steps, mutated(observations, 1, shrink)) if not f.known]
    # parity sees the shape; the dummy's own semantics see seq_lens != its query lengths
    assert {(f.check, f.kind, f.field) for f in findings} == {("parity", fk.VALUE_MISMATCH, "seq_lens"),
                                                              ("semantics", fk.VALUE_MISMATCH, "seq_lens")}


@pytest.mark.parametrize("field,step", [("positions", 2), ("input_ids", 4), ("seq_lens", 1),
                                        ("logits_indices", 2), ("query_start_loc", 0)])
def test_reference_catches_a_wrong_value(runs, field, step):
    config, steps, observations = runs["plain"]

    def bump(o: StepObs) -> None:
        values = o.get("prepare").fields[field].values.copy()
        values[-1] += 1
        set_field(o, "prepare", field, values=values)

    findings = [f for f in check_all(config, steps, mutated(observations, step, bump)) if not f.known]
    got = {(f.check, f.kind, f.stage, f.field, f.step) for f in findings}
    assert ("reference", fk.VALUE_MISMATCH, "prepare", field, step) in got
    # the batch's own consistency (semantics) may see the same field; nothing else moves
    related = {"seq_lens": "seq_lens_cpu_upper_bound"}  # a bumped length exceeds its upper bound
    assert got <= {("reference", fk.VALUE_MISMATCH, "prepare", field, step),
                   ("semantics", fk.VALUE_MISMATCH, "prepare", field, step),
                   ("semantics", fk.VALUE_MISMATCH, "prepare", related.get(field, field), step)}
    ref = next(f for f in findings if f.check == "reference")
    assert ref.req_ids and ref.expected != ref.actual


def test_reference_catches_batch_order_and_slot_moves(runs):
    config, steps, observations = runs["plain"]

    def reorder(o: StepObs) -> None:
        ids = o.get("gather").fields["req_ids"]
        set_field(o, "gather", "req_ids", values=list(reversed(ids.values)))

    findings = [f for f in check_all(config, steps, mutated(observations, 1, reorder)) if not f.known]
    # step 1's rows tie (ties are free), so the reversed order still meets the order
    # rules; what breaks is gather and prepare disagreeing on it
    order = [f for f in findings if f.field == "req_ids"]
    assert [(f.check, f.stage) for f in order] == [("reference", "prepare")]
    assert "differs" in order[0].message

    def move(o: StepObs) -> None:
        for stage, name in (("gather", "idx_mapping_np"), ("prepare", "idx_mapping_np"),
                            ("prepare", "idx_mapping")):
            values = o.get(stage).fields[name].values.copy()
            values[0] = 0  # a free slot (requests live in the top slots)
            set_field(o, stage, name, values=values)

    findings = [f for f in check_all(config, steps, mutated(observations, 3, move)) if not f.known]
    assert any(f.check == "reference" and "moved slots" in f.message for f in findings)


@pytest.mark.parametrize("name", ["pcp2", "pcp4-shard"])
def test_pcp_catches_wrong_rank_positions_and_restore_map(runs, name):
    config, steps, observations = runs[name]

    def shift(o: StepObs) -> None:
        values = o.get("partition", 1).fields["positions"].values.copy()
        values[0] += 1
        set_field(o, "partition", "positions", 1, values=values)

    findings = [f for f in check_all(config, steps, mutated(observations, 0, shift)) if not f.known]
    assert ("pcp", "positions", 1) in {(f.check, f.field, f.rank) for f in findings}

    def swap_restore(o: StepObs) -> None:
        values = o.get("partition", 0).fields["manager.hidden_restore_idx"].values.copy()
        values[[0, 1]] = values[[1, 0]]
        set_field(o, "partition", "manager.hidden_restore_idx", 0, values=values)

    findings = [f for f in check_all(config, steps, mutated(observations, 0, swap_restore)) if not f.known]
    assert {(f.check, f.field, f.rank) for f in findings} == {("pcp", "manager.hidden_restore_idx", 0)}


def test_pcp_catches_local_idx_mapping_dtype(runs):
    config, steps, observations = runs["pcp2"]

    def flip(o: StepObs) -> None:
        f = o.get("partition", 0).fields["idx_mapping"]
        set_field(o, "partition", "idx_mapping", 0, dtype="int32", values=f.values.astype(np.int32))

    findings = [f for f in check_all(config, steps, mutated(observations, 1, flip)) if not f.known]
    assert ("pcp", fk.DTYPE_DRIFT, "idx_mapping", 0) in {(f.check, f.kind, f.field, f.rank) for f in findings}
    assert ("contract", fk.DTYPE_DRIFT, "idx_mapping", 0) in {(f.check, f.kind, f.field, f.rank)
                                                               for f in findings}


def _adversarial_run(vllm_api, bad_step: Step) -> list[fk.Finding]:
    config = CONFIGS["plain"]
    harness = Harness(config, api=vllm_api)
    checker = Checker(config, adversarial=True)
    steps = [clean_steps()[0], bad_step]
    return [f for i, s in enumerate(steps) for f in checker.check(i, s, harness.run_step(s))]


def test_never_added_id_gives_key_error_naming_it(vllm_api):
    findings = _adversarial_run(vllm_api, Step(
        cached=[CachedUpdate("a", 40)], num_scheduled_tokens={"a": 1, "ghost": 1}))
    step1 = [f for f in findings if f.step == 1]
    kinds = {(f.kind, f.field, f.req_ids) for f in step1}
    assert (fk.CONTRACT_VIOLATION_INPUT, "unknown_scheduled_id", ("ghost",)) in kinds
    key = [f for f in step1 if f.kind == fk.KEY_ERROR]
    assert len(key) == 1 and key[0].req_ids == ("ghost",) and key[0].stage == "gather"
    assert key[0].exception_type == "KeyError"
    assert not [f for f in step1 if f.check in ("reference", "parity")]


def test_finished_then_scheduled_and_unknown_cached_fail_loudly(vllm_api):
    findings = _adversarial_run(vllm_api, Step(finished=["b"], num_scheduled_tokens={"b": 1},
                                               cached=[CachedUpdate("b", 20)]))
    assert {(f.kind, f.field) for f in findings if f.step == 1} >= {
        (fk.CONTRACT_VIOLATION_INPUT, "scheduled_after_finish"), (fk.KEY_ERROR, "scheduled_after_finish")}


def test_duplicate_new_id_is_silently_accepted_known(vllm_api):
    findings = _adversarial_run(vllm_api, Step(new_requests=[NewRequest("a", 3)],
                                               num_scheduled_tokens={"a": 3}))
    silent = [f for f in findings if f.kind == fk.SILENT_ACCEPTANCE]
    assert len(silent) == 1 and silent[0].req_ids == ("a",) and silent[0].known
