"""Spec-decode outcomes: the sampled rows (the bonus row at column drafts - rejected, also
with fewer drafts than K), final prefill chunks in a spec-decode batch, placeholder drafts,
and what postprocess writes back; with the greedy stand-in and vLLM's own rejection
sampler (standard and block verification)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from simrig import observe as obs
from simrig.checks.spec_outcomes import check_spec_outcomes, expected_outcomes
from simrig.observe import FieldObs, StageObs, StepObs
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step, synth_token

CONFIG = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256,
                      num_speculative_tokens=3)

# a: 3 drafts (K), one rejected; d: 3 drafts kept (bonus at column 3); b: 1 draft (< K),
# kept (bonus at column 1); c: 2 drafts (< K), kept; e: its final prefill chunk (samples 1)
# beside the drafts; f: a chunk that ends before its prompt's end (samples 0); g: the
# first step after a P/D remote KV load, its last prompt token with 2 placeholder drafts
# (both rejected).
STEPS = [
    Step(new_requests=[NewRequest("a", 40), NewRequest("b", 20), NewRequest("c", 5), NewRequest("d", 30)],
         num_scheduled_tokens={"a": 40, "b": 20, "c": 4, "d": 16}),
    Step(cached=[CachedUpdate("a", 40), CachedUpdate("b", 20), CachedUpdate("c", 4), CachedUpdate("d", 16)],
         new_requests=[NewRequest("e", 24), NewRequest("f", 50)],
         num_scheduled_tokens={"a": 1, "b": 1, "c": 1, "d": 14, "e": 12, "f": 10}),
    Step(cached=[CachedUpdate("a", 41), CachedUpdate("b", 21), CachedUpdate("c", 5), CachedUpdate("d", 30),
                 CachedUpdate("e", 12), CachedUpdate("f", 10)],
         new_requests=[NewRequest("g", 17, num_computed_tokens=16)],
         num_scheduled_tokens={"a": 4, "b": 2, "c": 3, "d": 4, "e": 12, "f": 10, "g": 3},
         spec_tokens={"a": 3, "b": 1, "c": 2, "d": 3, "g": 2}, rejected={"a": 1, "g": 2}),
]


def _pred(req_ids, scheduled, drafts, computed, prefill):
    arr = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return SimpleNamespace(req_ids=req_ids, num_scheduled=arr(scheduled), num_drafts=arr(drafts),
                           num_computed=arr(computed), prefill_len=arr(prefill), spread=frozenset())


def test_expected_counts_follow_the_steps_meaning():
    step = Step(num_scheduled_tokens={"x": 3, "y": 2, "p": 5, "q": 4, "g": 3},
                spec_tokens={"x": 2, "y": 1, "g": 2}, rejected={"x": 1, "g": 2})
    # x: 2 drafts, 1 rejected; y: 1 draft (< K); p: final chunk; q: chunk ending early;
    # g: a placeholder-draft row (its last prompt token, 2 drafts, both rejected)
    pred = _pred(["x", "y", "p", "q", "g"], [3, 2, 5, 4, 3], [2, 1, 0, 0, 2], [10, 7, 5, 0, 16],
                 [10, 7, 10, 9, 17])
    sampled, first, computed = expected_outcomes(step, pred)
    assert sampled.tolist() == [2, 2, 1, 0, 1]
    assert first.tolist() == [11, 8, 10, 4, 17]
    assert computed.tolist() == [12, 9, 10, 4, 17]


def _post(fields: dict[str, np.ndarray]) -> StepObs:
    stage = StageObs(stage=obs.POSTPROCESS, rank=None)
    stage.fields = {k: FieldObs("numpy", str(v.dtype), v.shape, v) for k, v in fields.items()}
    return StepObs(index=0, stages=[stage])


def test_a_bonus_token_in_the_wrong_column_is_a_finding():
    step = Step(num_scheduled_tokens={"x": 2, "y": 4}, spec_tokens={"x": 1, "y": 3})
    pred = _pred(["x", "y"], [2, 4], [1, 3], [10, 20], [10, 20])
    good = np.array([[synth_token("x", 11), synth_token("x", 12), 0, 0],
                     [synth_token("y", 21 + j) for j in range(4)]], dtype=np.int64)
    last = np.array([synth_token("x", 12), synth_token("y", 24)], dtype=np.int64)
    done = np.array([12, 24], dtype=np.int64)
    fields = {"sampled_tokens": good, "post.last_sampled_tokens": last, "post.num_computed_tokens": done}
    assert check_spec_outcomes(0, CONFIG, step, _post(fields), pred) == []
    bad = good.copy()
    bad[0, 1], bad[0, 3] = 0, synth_token("x", 12)  # x's bonus token placed at column K
    found = check_spec_outcomes(0, CONFIG, step, _post({**fields, "sampled_tokens": bad}), pred)
    assert [(f.field, f.req_ids) for f in found] == [("sampled_tokens", ("x",))]
    found = check_spec_outcomes(0, CONFIG, step, _post({**fields, "post.num_computed_tokens": done + 1}), pred)
    assert {f.field for f in found} == {"post.num_computed_tokens"}


from strategies.configs import vllm_samplers_run_here  # noqa: E402

# vLLM's own samplers where Triton's CPU interpreter runs them (0.30.0's libdevice log1p: answer_libdevice)
SAMPLERS = ["", "standard", "block"] if vllm_samplers_run_here() else [""]


@pytest.mark.vllm
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_real_steps_judge_clean_with_every_rejection_sampler(vllm_api, sampler):
    from dataclasses import replace

    from simrig.checks.checker import Checker
    from simrig.harness import Harness

    config = replace(CONFIG, rejection_sampler=sampler)
    harness = Harness(config, api=vllm_api)
    checker = Checker(config)
    seen = {}
    for i, step in enumerate(STEPS):
        result = harness.run_step(step)
        post = result.get(obs.POSTPROCESS)
        assert post is not None and post.error is None, post
        found = [f for f in checker.check(i, step, result) if f.check in ("spec_outcomes", "fields")]
        assert found == [], found
        seen = post.fields
    order = list(seen["output.req_ids"].values)
    sampled = dict(zip(order, np.asarray(seen["num_sampled"].values)[: len(order)].tolist()))
    assert sampled == {"a": 3, "b": 2, "c": 3, "d": 4, "e": 1, "f": 0, "g": 1}
    rows = np.asarray(seen["sampled_tokens"].values)
    assert rows[order.index("b"), 1] == synth_token("b", 23)  # b's bonus token, column 1 of 4
