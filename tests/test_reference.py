"""The reference model: batch order against vLLM's own sort, predictions by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from simrig.reference.reference import ReferenceModel, batch_order, short
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step, synth_token


def test_batch_order_groups_and_keeps_scheduler_order_on_ties():
    scheduled = {"p1": 7, "d1": 1, "x": 3, "s": 3, "d2": 1, "p2": 5, "y": 3}
    drafts = {"x": 2, "s": 1}
    # with decode_query_len 3: drafts first (x, s tie at 3 tokens: scheduler order),
    # then the decode-length query y, then the rest by ascending length
    assert batch_order(scheduled, drafts, decode_query_len=3) == ["x", "s", "y", "d1", "d2", "p2", "p1"]
    assert batch_order(scheduled, {}, decode_query_len=1) == ["d1", "d2", "x", "s", "y", "p2", "p1"]


@pytest.mark.vllm
def test_batch_order_matches_vllm_sort_on_random_batches(vllm_api):
    rng = random.Random(7)
    for case in range(300):
        n = rng.randint(1, 12)
        dql = rng.randint(1, 3)
        scheduled = {f"r{rng.randint(0, 99)}_{i}": rng.choice([1, 2, 3, dql, 5, 5, 17]) for i in range(n)}
        drafts = {r: [-1] * rng.randint(1, 2) for r in scheduled if rng.random() < 0.3}
        expected = vllm_api.sort_batch_req_ids(scheduled, drafts, dql)
        got = batch_order(scheduled, {r: len(d) for r, d in drafts.items()}, dql)
        assert got == expected, (case, scheduled, drafts, dql)


def test_predictions_follow_the_lifecycle():
    model = ReferenceModel(RunnerConfig(num_speculative_tokens=1))
    s0 = Step(new_requests=[NewRequest("a", 4), NewRequest("b", 3, prompt_token_ids=[7, 8, 9])],
              num_scheduled_tokens={"a": 4, "b": 2})
    model.apply_lifecycle(s0)
    p = model.predict(s0)
    assert p.req_ids == ["b", "a"]  # shorter query first
    assert p.query_start_loc.tolist() == [0, 2, 6]
    assert p.positions.tolist() == [0, 1, 0, 1, 2, 3]
    assert p.input_ids.tolist()[:2] == [7, 8]
    assert p.input_ids.tolist()[2:] == [synth_token("a", i) for i in range(4)]
    assert p.logits_indices.tolist() == [1, 5]
    assert p.is_prefilling.tolist() == [True, True]
    model.advance(s0)
    s1 = Step(cached=[CachedUpdate("a", 4), CachedUpdate("b", 2)],
              num_scheduled_tokens={"a": 2, "b": 1}, spec_tokens={"a": 1})
    model.apply_lifecycle(s1)
    p = model.predict(s1)
    assert p.req_ids == ["a", "b"]  # drafts first
    assert p.seq_lens.tolist() == [6, 3]
    assert p.input_ids.tolist() == [synth_token("a", 4), synth_token("a", 5), 9]
    assert p.cu_num_logits.tolist() == [0, 2, 3]
    assert p.logits_indices.tolist() == [0, 1, 2]
    assert p.is_prefilling.tolist() == [False, True]


def test_unknown_id_has_no_prediction():
    model = ReferenceModel(RunnerConfig())
    assert model.predict(Step(num_scheduled_tokens={"ghost": 1})) is None


def test_short_shows_the_window_of_the_first_difference():
    text = short(np.arange(100), at=60)
    assert "60" in text and "(100 in all)" in text and text.startswith("[57:69]")


def test_a_rejected_draft_shows_in_input_ids_and_the_next_step_rolls_back():
    from simrig.step import SYNTH_VOCAB_SIZE

    model = ReferenceModel(RunnerConfig(num_speculative_tokens=2))
    s0 = Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})
    model.apply_lifecycle(s0)
    model.advance(s0)
    # decode at position 4 with drafts for 5 and 6; the sampler rejects the last one
    s1 = Step(cached=[CachedUpdate("a", 4)], num_scheduled_tokens={"a": 3},
              spec_tokens={"a": 2}, rejected={"a": 1})
    model.apply_lifecycle(s1)
    p = model.predict(s1)
    assert p.input_ids.tolist() == [synth_token("a", 4), synth_token("a", 5),
                                    (synth_token("a", 6) + 1) % SYNTH_VOCAB_SIZE]
    model.advance(s1)
    # 4 + 3 - 1 = 6 computed: the next query starts at the rejected position with the target's token
    s2 = Step(cached=[CachedUpdate("a", 6)], num_scheduled_tokens={"a": 1})
    model.apply_lifecycle(s2)
    p = model.predict(s2)
    assert p.positions.tolist() == [6] and p.input_ids.tolist() == [synth_token("a", 6)]


def test_order_rules_come_from_the_documented_layout_not_from_one_sort():
    from simrig.reference.reference import order_problem

    scheduled = {"p": 7, "d1": 1, "v": 3, "d2": 1, "e": 2}
    drafts = {"v": 2}
    ok = ["v", "d2", "d1", "e", "p"]  # ties (d1, d2) in any order
    assert order_problem(ok, scheduled, drafts, decode_query_len=1) == ""
    assert "rule 1" in order_problem(["d1", "v", "d2", "e", "p"], scheduled, drafts, 1)
    assert "rule 2" in order_problem(["v", "d1", "e", "d2", "p"], scheduled, drafts, 1)
    assert "rule 2" in order_problem(["v", "d1", "d2", "p", "e"], scheduled, drafts, 1)
    assert "each once" in order_problem(["v", "d1", "d2", "e"], scheduled, drafts, 1)
