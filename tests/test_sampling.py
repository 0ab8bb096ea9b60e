"""sample_tokens runs for real after every step: the stand-in logits name the
trace's tokens, vLLM's own Sampler picks them too, and what the runner hands
the scheduler is checked."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from simrig import observe as obs
from simrig.checks.fields import _runner_output
from simrig.harness import Harness
from simrig.observe import FieldObs, StageObs
from simrig.report.snapshot import scenario_steps
from simrig.step import RunnerConfig, synth_token

pytestmark = pytest.mark.vllm

CONFIG = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256)


def _outputs(result: obs.StepObs) -> dict[str, list[int]]:
    post = result.get(obs.POSTPROCESS)
    assert post is not None and post.error is None, post
    ids = post.fields["output.req_ids"].values
    return dict(zip(ids, post.fields["output.sampled_token_ids"].values))


# Steps 0-1 of the scenario: a (40) and b (20) prefill whole, c prefills 4 of 5
# tokens; then a and b decode and c schedules its last prompt token.
# A logit row ending at position p names synth_token(req, p + 1).
EXPECTED = [
    {"a": [synth_token("a", 40)], "b": [synth_token("b", 20)], "c": []},
    {"a": [synth_token("a", 41)], "b": [synth_token("b", 21)], "c": [synth_token("c", 5)]},
]


def test_stand_in_sampler_hands_the_scheduler_the_trace_tokens(vllm_api):
    harness = Harness(CONFIG, api=vllm_api)
    for step, want in zip(scenario_steps()[:2], EXPECTED):
        assert _outputs(harness.run_step(step)) == want


def test_vllms_own_sampler_picks_the_same_tokens(vllm_api):
    """The real Sampler (Gumbel kernel in Triton's interpreter: about a second
    a step) on the stand-in logits: the logits alone decide the tokens."""
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    harness = Harness(CONFIG, api=vllm_api)
    runner = harness.runner
    params = inspect.signature(Sampler).parameters
    kwargs = {"vllm_config": runner.vllm_config, "max_num_reqs": runner.max_num_reqs,
              "vocab_size": runner.vocab_size, "device": runner.device,
              "req_states": runner.req_states, "num_speculative_tokens": runner.decode_query_len}
    runner.sampler = Sampler(**{k: v for k, v in kwargs.items() if k in params})
    for step, want in zip(scenario_steps()[:2], EXPECTED):
        assert _outputs(harness.run_step(step)) == want


def test_spec_decode_output_drops_rejected_drafts(vllm_api):
    """Step 2 verifies 2 drafts each for a and c; a's second is rejected: a
    gets its accepted draft plus the target's token there, c both drafts plus
    the bonus token."""
    config = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256,
                          num_speculative_tokens=2)
    harness = Harness(config, api=vllm_api)
    results = [harness.run_step(step) for step in scenario_steps()]
    got = _outputs(results[2])
    assert got["a"] == [synth_token("a", 42), synth_token("a", 43)]
    assert got["c"] == [synth_token("c", 6), synth_token("c", 7), synth_token("c", 8)]
    assert got["b"] == [synth_token("b", 22)]
    post = results[2].get(obs.POSTPROCESS).fields
    order = post["output.req_ids"].values
    assert post["num_rejected"].values[order.index("a")] == 1


def test_pcp_sampling_restores_the_global_batch(vllm_api):
    config = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256,
                          pcp_size=2)
    harness = Harness(config, api=vllm_api)
    for step, want in zip(scenario_steps()[:2], EXPECTED):
        assert _outputs(harness.run_step(step)) == want


def test_a_failed_profile_run_is_a_profile_stage_error(vllm_api, monkeypatch):
    harness = Harness(CONFIG, api=vllm_api)

    def broken() -> None:
        raise RuntimeError("profile failed")

    monkeypatch.setattr(harness.runner, "profile_run", broken)
    result = harness.run_step(scenario_steps()[0])
    errors = [s for s in result.errors if s.stage == obs.PROFILE]
    assert errors and errors[0].error.type == "RuntimeError"
    assert not result.step_failed()  # the step itself still ran


def _post(lengths: list[int], ids: list[str]) -> StageObs:
    return StageObs(stage=obs.POSTPROCESS, fields={
        "output.req_ids": FieldObs("list", "", (len(ids),), ids),
        "output.num_sampled_tokens": FieldObs("list", "", (len(lengths),), lengths)})


def test_output_check_flags_a_token_past_those_sampled():
    rows, sampled = ["a", "b"], np.array([1, 0])
    assert _runner_output(0, _post([1, 0], rows), rows, sampled, frozenset()) == []
    found = _runner_output(0, _post([1, 1], rows), rows, sampled, frozenset())
    assert [(f.field, f.req_ids) for f in found] == [("output.sampled_token_ids", ("b",))]
    found = _runner_output(0, _post([1, 0], ["b", "a"]), rows, sampled, frozenset())
    assert [f.field for f in found] == ["output.req_ids"]


def test_output_check_flags_a_wrong_token():
    rows, sampled, first = ["a", "b"], np.array([2, 1]), np.array([10, 3])
    post = _post([2, 1], rows)
    good = [[synth_token("a", 10), synth_token("a", 11)], [synth_token("b", 3)]]
    post.fields["output.sampled_token_ids"] = FieldObs("list", "", (2,), good)
    assert _runner_output(0, post, rows, sampled, frozenset(), first) == []
    post.fields["output.sampled_token_ids"] = FieldObs("list", "", (2,), [good[0][::-1], good[1]])
    found = _runner_output(0, post, rows, sampled, frozenset(), first)
    assert [(f.field, f.req_ids) for f in found] == [("output.sampled_token_ids", ("a",))]
