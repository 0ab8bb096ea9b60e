"""vLLM's own sampler, driven with each request's sampling parameters, judged per request:
a clean replay of every parameter family, and faults seeded in vLLM's sampling state
(a parameter read from another slot, penalty counts lost) found by the sampling oracle."""

from __future__ import annotations

import numpy as np
import pytest

from simrig.replay import replay_problems
from simrig.sampling.params import SamplingSpec
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceHeader

pytestmark = pytest.mark.vllm

CONFIG = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=128)
SPECS = {
    "plain": None,
    "hot": SamplingSpec(temperature=0.7, top_k=20),
    "nucleus": SamplingSpec(top_p=0.5, presence_penalty=1.0, frequency_penalty=0.5),
    "greedy": SamplingSpec(temperature=0.0, repetition_penalty=1.5, logit_bias=((7, 5.0),)),
    "minp": SamplingSpec(min_p=0.2, bad_words=((5,), (9, 10))),
    "late": SamplingSpec(min_tokens=3, stop_token_ids=(1, 2, 3), temperature=1.3),
}


def steps(num_decodes: int = 4) -> list[Step]:
    ids = list(SPECS)
    out = [Step(new_requests=[NewRequest(r, prompt_len=12, sampling=SPECS[r], block_ids=[i])
                              for i, r in enumerate(ids)],
                num_scheduled_tokens={r: 12 for r in ids})]
    out += [Step(cached=[CachedUpdate(r, 12 + s) for r in ids], num_scheduled_tokens={r: 1 for r in ids})
            for s in range(num_decodes)]
    return out


def test_every_parameter_family_replays_clean_through_vllms_sampler(vllm_api):
    assert replay_problems(TraceHeader(config=CONFIG), steps(), api=vllm_api) == []


def test_the_sampler_runs_on_batches_with_parameters_and_hands_out_its_tokens(vllm_api):
    from simrig import observe as obs
    from simrig.harness import Harness

    harness = Harness(CONFIG, api=vllm_api)
    results = [harness.run_step(step) for step in steps(2)]
    for result in results:
        seen = result.sampled
        assert seen is not None and len(seen["calls"]) == 1
        assert sorted(req for _, req, _ in seen["rows"]) == sorted(r for r, s in SPECS.items() if s)
        call = seen["calls"][0]
        assert call.processed.shape == (len(SPECS), 4096)
        post = result.get(obs.POSTPROCESS).fields
        handed = dict(zip(post["output.req_ids"].values, post["output.sampled_token_ids"].values))
        for row, req_id, _ in seen["rows"]:
            assert handed[req_id] == [int(call.sampled[row])]
    top_k_row = next(row for row, req, _ in results[1].sampled["rows"] if req == "hot")
    assert int(np.isfinite(results[1].sampled["calls"][0].processed[top_k_row]).sum()) == 20


def test_a_temperature_read_from_another_slot_is_found(vllm_api, monkeypatch):
    """A seeded routing fault: each request's temperature lands in the next slot."""
    from vllm.v1.worker.gpu.sample.states import SamplingStates

    original = SamplingStates.add_request

    def add_request(self, req_idx, sampling_params):
        needs = original(self, req_idx, sampling_params)
        self.temperature.np[(req_idx + 1) % self.max_num_reqs] = sampling_params.temperature
        return needs

    monkeypatch.setattr(SamplingStates, "add_request", add_request)
    problems = replay_problems(TraceHeader(config=CONFIG), steps(1), api=vllm_api)
    assert any("sampler.processed_logits" in p for p in problems), problems


def test_a_prompt_the_penalties_never_count_is_found(vllm_api, monkeypatch):
    """A seeded history fault: a new request's prompt and earlier outputs never reach the
    penalties' prompt mask and bin counts, so its repetition penalty misses them."""
    from vllm.v1.worker.gpu.sample.penalties import PenaltiesState

    original = PenaltiesState.apply_staged_writes

    def apply_staged_writes(self):
        self._new_penalties_reqs.clear()
        original(self)

    monkeypatch.setattr(PenaltiesState, "apply_staged_writes", apply_staged_writes)
    problems = replay_problems(TraceHeader(config=CONFIG), steps(1), api=vllm_api)
    assert any("sampler.processed_logits" in p and "greedy" in p for p in problems), problems


LOGPROB_SPECS = {"a": SamplingSpec(logprobs=3), "b": None, "c": SamplingSpec(logprobs=0, temperature=0.5),
                 "d": SamplingSpec(logprobs=-1, top_k=4)}


def logprob_steps() -> list[Step]:
    ids = list(LOGPROB_SPECS)
    out = [Step(new_requests=[NewRequest(r, prompt_len=10, sampling=LOGPROB_SPECS[r], block_ids=[i])
                              for i, r in enumerate(ids)], num_scheduled_tokens={r: 10 for r in ids})]
    return out + [Step(cached=[CachedUpdate(r, 10 + s) for r in ids], num_scheduled_tokens={r: 1 for r in ids})
                  for s in range(2)]


def test_logprobs_of_every_width_replay_clean(vllm_api):
    assert replay_problems(TraceHeader(config=CONFIG), logprob_steps(), api=vllm_api) == []


def test_logprob_rows_taken_from_the_wrong_request_are_found(vllm_api, monkeypatch):
    """A seeded fault of the kind vllm#33391 fixed: the logprob rows shifted by one request."""
    import torch
    from vllm.v1.worker.gpu.sample import sampler as sampler_module

    original = sampler_module.compute_topk_scores

    def shifted(*args, **kwargs):
        out = original(*args, **kwargs)
        return type(out)(*(torch.roll(t, 1, dims=0) if isinstance(t, torch.Tensor) else t for t in out))

    monkeypatch.setattr(sampler_module, "compute_topk_scores", shifted)
    problems = replay_problems(TraceHeader(config=CONFIG), logprob_steps(), api=vllm_api)
    assert any("output.logprobs" in p for p in problems), problems


def test_a_history_whose_length_is_never_written_is_found(vllm_api, monkeypatch):
    """The stored history's length (total_len) left as admission wrote it: penalties and
    bad words would read a history without the tokens the request was given."""
    from vllm.v1.worker.gpu import model_runner

    original = model_runner.GPUModelRunner.postprocess_sampled

    def postprocess_sampled(self, *args, **kwargs):
        before = self.req_states.total_len.gpu.clone()
        original(self, *args, **kwargs)
        self.req_states.total_len.gpu.copy_(before)

    monkeypatch.setattr(model_runner.GPUModelRunner, "postprocess_sampled", postprocess_sampled)
    problems = replay_problems(TraceHeader(config=CONFIG), steps(1), api=vllm_api)
    assert any("req_states.all_token_ids" in p for p in problems), problems


def test_a_structured_output_requests_logprobs_come_from_its_masked_row(vllm_api):
    """The shrunk trace of a campaign class the oracle itself made (tests/fixtures, as the
    shrinker wrote it): a structured-output request asking for logprobs, its grammar allowing
    about half the vocabulary. The runner masks the logits before the sampler sees them
    ("Apply grammar bitmask to the logits in-place", GPUModelRunner.sample), so its raw
    logprobs are those of the masked row; judged against the unmasked one, every row differed."""
    from pathlib import Path

    from simrig.trace_io.trace import read_trace

    header, trace_steps = read_trace(Path(__file__).parent / "fixtures" / "grammar_request_logprobs.jsonl")
    assert trace_steps[0].grammar and trace_steps[0].new_requests[0].sampling.logprobs == 1
    assert replay_problems(header, trace_steps, api=vllm_api) == []
