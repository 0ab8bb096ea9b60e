"""Structured output under speculative decoding: a greedy grammar request verified by vLLM's
own RejectionSampler, its drafts drawn inside its grammar, every row of it (drafts and bonus)
masked by the step's set, in each release's bitmask layout; the bundled trace through vLLM."""

from __future__ import annotations

import numpy as np
import pytest

from simrig.sampling.drafts import spread_drafts
from simrig.sampling.logits import spread_logits
from simrig.sampling.params import SamplingSpec
from simrig.step import synth_token

TRACE = "traces/samples/sampling_grammar_spec_decode.jsonl"
V = 4096
GREEDY = SamplingSpec(temperature=0.0)


def test_kept_drafts_lie_inside_the_grammar_and_are_its_best_tokens():
    allowed = (5, 900, 3000, 4095)
    prompt = [synth_token("q", p) for p in range(6)]
    got = spread_drafts("q", GREEDY, prompt, [], first=6, num_drafts=3, first_rejected=2, vocab_size=V,
                        allowed=allowed)
    for j in range(2):  # kept: the best allowed token of the row before it
        row = spread_logits("q", 5 + j, V)
        assert got[j] == allowed[int(np.argmax(row[list(allowed)]))]
    best = allowed[int(np.argmax(spread_logits("q", 7, V)[list(allowed)]))]
    assert got[2] == (best + 1) % V  # rejected: not the row's best, whatever the grammar allows
    free = spread_drafts("q", GREEDY, prompt, [], first=6, num_drafts=1, first_rejected=1, vocab_size=V)
    assert free[0] == int(np.argmax(spread_logits("q", 5, V)))  # no grammar: the whole row's best


# (step, request) -> its grammar's set that step, from the trace: every token handed out lies in it
SETS = {(1, "a"): set(range(0, 64, 2)), (1, "b"): {7, 300, 1201, 2048, 4001},
        (2, "a"): {1, 3, 5, 7, 9, 11, 13, 15, 2999, 3001}, (2, "b"): {300},
        (4, "a"): set(range(0, 64, 2)), (4, "c"): {40, 41, 42, 43, 44}, (5, "a"): {100, 200, 300},
        (5, "c"): {41, 42}, (4, "d"): {5, 6, 7}, (5, "d"): {11, 13}}
# tokens handed out per the trace: kept drafts + 1 (step 1: a keeps 1 of 2, b both; step 4: a, c none)
COUNTS = {(1, "a"): 2, (1, "b"): 3, (2, "a"): 3, (2, "b"): 2, (4, "a"): 1, (4, "c"): 1, (5, "a"): 3, (5, "c"): 3,
          (4, "d"): 1, (5, "d"): 1}  # d: its two placeholder drafts rejected, then a plain decode


@pytest.mark.vllm
def test_the_bundled_trace_keeps_every_grammar_requests_tokens_inside_its_set(vllm_api, monkeypatch):
    from simrig.findings.classes import fails_run, verdict_of
    from simrig.observe import handed_to_scheduler
    from simrig.replay import run_steps
    from simrig.trace_io.trace import read_trace

    header, steps = read_trace(TRACE)
    assert header.config.rejection_sampler == "standard" and header.config.num_speculative_tokens == 2
    invalid = _record_invalid_drafts(monkeypatch)
    handed_out = {}
    for replayed in run_steps(header, enumerate(steps), api=vllm_api):
        o = replayed.observation
        assert not o.errors and not [f for f in replayed.findings if fails_run(verdict_of(f))], replayed.findings
        handed = handed_to_scheduler(o)
        handed_out.update({(o.index, r): handed[r] for r in ("a", "b", "c", "d") if (o.index, r) in SETS})
        if o.index == 1:  # every row of each grammar request judged: 1 + its drafts
            rows = [r for _, r, _ in o.sampled["rows"]]
            assert rows.count("a") == 3 and rows.count("b") == 3
    assert {key: len(tokens) for key, tokens in handed_out.items()} == COUNTS
    assert all(set(tokens) <= SETS[key] for key, tokens in handed_out.items()), handed_out
    assert handed_out[(2, "b")] == [300, 300]  # its one allowed token, kept as a draft and sampled after
    if invalid is not None:  # 0.32+: the placeholder rows of d, and only they, are invalid drafts
        assert [n for n, rows in invalid] == [4], invalid  # the one step with placeholders
        assert invalid[0][1] == 2  # d's two rows after its first


def _record_invalid_drafts(monkeypatch) -> list | None:
    """Each non-None ``grammar_invalid_drafts`` answer as (call number, rows marked); None where
    the release has no such function (0.30-0.31)."""
    from vllm.v1.worker.gpu import model_runner

    real = getattr(model_runner, "grammar_invalid_drafts", None)
    if real is None:
        return None
    seen: list = []
    calls = iter(range(10_000))

    def recorded(*args, **kwargs):
        out = real(*args, **kwargs)
        n = next(calls)
        if out is not None:
            seen.append((n, int(out.sum())))
        return out

    monkeypatch.setattr(model_runner, "grammar_invalid_drafts", recorded)
    return seen


@pytest.mark.vllm
@pytest.mark.parametrize("fixture", ["placeholder_row_penalties.jsonl", "placeholder_row_min_tokens.jsonl"])
def test_a_row_after_a_placeholder_draft_is_not_judged(fixture):
    """Two traces the shrinker wrote when the oracle judged those rows (penalties counting the
    placeholder as a token, min_tokens not counting its position): vLLM computes such a row with
    the placeholder as a position without a token, and never samples from it."""
    from pathlib import Path

    from simrig.replay import replay_trace  # lazy: imports vLLM

    result = replay_trace(Path(__file__).resolve().parent / "fixtures" / fixture)
    assert set(result.findings["verdict"]) <= {"known"}
    assert result.findings[result.findings["check"] == "sampling"].empty
