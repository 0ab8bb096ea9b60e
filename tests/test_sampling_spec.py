"""Sampling parameters under speculative decoding: which requests are spread, the drafts a
greedy spread request gets (its processed rows' argmax where the trace keeps them), the
bundled trace through vLLM's own RejectionSampler with its tokens pinned, and faults in the
verifier's processing found by the sampling oracle (slow)."""

from __future__ import annotations

import numpy as np
import pytest

from simrig.sampling.drafts import spread_drafts
from simrig.sampling.logits import Drafting, drafting, spread_logits, spreads
from simrig.sampling.params import SamplingSpec
from simrig.step import RunnerConfig, synth_token

TRACE = "traces/samples/sampling_spec_decode.jsonl"
GREEDY = SamplingSpec(temperature=0.0, repetition_penalty=1.4)
V = 4096


def test_under_drafts_only_greedy_requests_verified_by_vllms_sampler_are_spread():
    vllm_verifier, stand_in = Drafting(2, "standard"), Drafting(2)
    assert spreads(GREEDY, vllm_verifier) and spreads(SamplingSpec(temperature=0.0), Drafting(1, "block"))
    assert not spreads(GREEDY, stand_in) and not spreads(GREEDY, 2)  # the greedy stand-in verifier
    assert not spreads(SamplingSpec(temperature=0.8, seed=7), vllm_verifier)  # acceptance: the sampler's
    assert not spreads(None, vllm_verifier)
    # a grammar request too, when greedy and verified by vLLM (its drafts follow its grammar)
    assert spreads(SamplingSpec(temperature=0.0), vllm_verifier, structured=True)
    assert not spreads(SamplingSpec(temperature=0.0), stand_in, structured=True)
    assert spreads(SamplingSpec(temperature=0.8), Drafting(0, "")) and spreads(SamplingSpec(top_k=5), 0)


def test_drafting_reads_a_config_and_stays_an_int():
    d = drafting(RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128,
                              num_speculative_tokens=3, rejection_sampler="block"))
    assert d == 3 and d + 1 == 4 and d.rejection_sampler == "block"
    assert drafting(RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128)) == 0


def test_kept_drafts_are_the_rows_argmax_and_rejected_ones_are_not():
    prompt = [synth_token("q", p) for p in range(6)]
    outputs = [11, 12]
    got = spread_drafts("q", GREEDY, prompt, outputs, first=8, num_drafts=3, first_rejected=1, vocab_size=V)
    row0 = spread_logits("q", 7, V).astype(np.float64)  # the row before the first draft
    seen = set(prompt) | set(outputs)
    row0[list(seen)] = np.where(row0[list(seen)] > 0, row0[list(seen)] / 1.4, row0[list(seen)] * 1.4)
    assert got[0] == int(np.argmax(row0))
    row1 = spread_logits("q", 8, V).astype(np.float64)
    seen.add(got[0])  # the kept draft counts for the next row's penalty
    row1[list(seen)] = np.where(row1[list(seen)] > 0, row1[list(seen)] / 1.4, row1[list(seen)] * 1.4)
    assert got[1] == (int(np.argmax(row1)) + 1) % V  # rejected: another token
    assert len(got) == 3 and got[2] != got[1]


def test_a_bad_word_completes_across_a_kept_draft():
    spec = SamplingSpec(temperature=0.0)
    first = spread_drafts("w", spec, [1, 2, 3], [], first=3, num_drafts=2, first_rejected=2, vocab_size=V)
    banned = SamplingSpec(temperature=0.0, bad_words=((first[0], first[1]),))
    again = spread_drafts("w", banned, [1, 2, 3], [], first=3, num_drafts=2, first_rejected=2, vocab_size=V)
    row = spread_logits("w", 3, V).astype(np.float64)
    row[first[1]] = -np.inf  # the word's last token, masked after its prefix (the kept draft)
    assert again[0] == first[0] and again[1] == int(np.argmax(row)) != first[1]


# the greedy requests' tokens in the bundled trace, per step: each kept draft and the token after it,
# computed from simrig.sampling.processing alone (the trace's source description says why)
PINNED = {1: {"g": [2326, 43]}, 2: {"g": [2266, 1388, 1494]}, 3: {"g": [2188, 1775]},
          5: {"h": [109]}, 6: {"h": [1778, 532, 2962]}}


@pytest.mark.vllm
def test_the_bundled_trace_keeps_the_traces_drafts_through_vllms_rejection_sampler(vllm_api):
    from simrig.observe import handed_to_scheduler
    from simrig.replay import run_steps
    from simrig.findings.classes import fails_run, verdict_of
    from simrig.trace_io.trace import read_trace

    header, steps = read_trace(TRACE)
    assert header.config.rejection_sampler == "standard"
    seen = {}
    for replayed in run_steps(header, enumerate(steps), api=vllm_api):
        o = replayed.observation
        assert not o.errors, [(e.stage, e.error) for e in o.errors]
        assert not [f for f in replayed.findings if fails_run(verdict_of(f))], replayed.findings
        handed = handed_to_scheduler(o)
        seen[o.index] = {r: handed[r] for r in ("g", "h") if r in handed and o.index in PINNED}
        if o.index == 2:  # every row of g (the drafts' and the bonus row) judged from vLLM's verifier
            assert sorted(p for _, r, p in o.sampled["rows"] if r == "g") == [12, 13, 14]
            assert o.sampled["calls"][-1].processed.shape == (9, V)
    assert {i: seen[i] for i in PINNED} == PINNED


def _faulty_replay(vllm_api, monkeypatch, fault):
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    from simrig.replay import replay_problems
    from simrig.trace_io.trace import read_trace

    original = Sampler.apply_sampling_params
    monkeypatch.setattr(Sampler, "apply_sampling_params", lambda self, logits, *a, **k: original(
        self, logits, *fault(list(a)), **k))
    header, steps = read_trace(TRACE)
    return replay_problems(header, steps[:4], api=vllm_api)


@pytest.mark.vllm
@pytest.mark.slow
def test_drafts_the_penalties_never_count_are_found(vllm_api, monkeypatch):
    """A seeded fault: the step's draft ids never reach penalties and bad words (input_ids zeroed)."""
    def fault(args):
        args[4] = args[4] * 0  # input_ids: the draft tokens of each row
        return args
    problems = _faulty_replay(vllm_api, monkeypatch, fault)
    assert any("sampler.processed_logits" in p for p in problems), problems


@pytest.mark.vllm
@pytest.mark.slow
def test_rows_reading_another_requests_parameters_are_found(vllm_api, monkeypatch):
    """A seeded routing fault: every logit row reads the next row's request state."""
    def fault(args):
        args[0] = args[0].roll(1)  # expanded_idx_mapping
        return args
    problems = _faulty_replay(vllm_api, monkeypatch, fault)
    assert any("sampler.processed_logits" in p or "output.sampled_token_ids" in p for p in problems), problems
