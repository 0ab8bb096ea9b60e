"""The selftest's sampling family (``simrig/selftest/catalogue_sampling.py``): one seeded
fault per kind in vLLM's sampler state, each found by a replay of the bundled sampling
trace written for it, on the row and step that trace sets up; the unmutated code replays
those traces clean; one fault is found by the valid campaign alone. (That every mutant of
the catalogue applies to the installed source is tests/test_selftest.py's.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.selftest.catalogue import BY_NAME, CATALOGUE
from simrig.selftest.catalogue_sampling import SAMPLING

SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "samples"
TRACES = ("sampling_temperature_topk_topp.jsonl", "sampling_penalties.jsonl",
          "sampling_bias_badwords_mintokens.jsonl", "sampling_grammar.jsonl",
          "sampling_prompt_logprobs.jsonl", "sampling_logprobs.jsonl")
SPEC_TRACE = "sampling_spec_decode.jsonl"  # replayed clean by tests/test_sampling_spec.py
GRAMMAR_SPEC_TRACE = "sampling_grammar_spec_decode.jsonl"  # and this one by tests/test_sampling_grammar_spec.py
SIGNATURE = ["value_mismatch", "postprocess", "sampler.processed_logits"]
# a mutant whose first wrong row shows in another field than the processed logits
SIGNATURES = {"grammar-mask-by-scheduler-position": ["value_mismatch", "postprocess", "sampler.grammar_mask"],
              "prompt-logprobs-chunk-loses-its-last-row": ["value_mismatch", "postprocess",
                                                           "output.prompt_logprobs"],
              "history-length-never-advanced": ["value_mismatch", "postprocess", "req_states.all_token_ids"],
              "logprobs-from-the-previous-row": ["value_mismatch", "postprocess", "output.logprobs"],
              "spec-logprobs-sliced-by-request-index": ["value_mismatch", "postprocess", "output.logprobs"],
              "grammar-mask-drafts-on-first-row": ["value_mismatch", "postprocess", "num_sampled"],
              "seed-stream-keyed-by-slot": ["value_mismatch", "postprocess", "sampler.seeded_tokens"]}

# mutant -> (the trace that shows it, the step its first wrong row samples at, that row's request)
FOUND_BY = {
    # k (top_k 20) samples at step 0 in batch row 1, where slot 1 holds plain's k (none)
    "sampling-top-k-by-batch-row": ("sampling_temperature_topk_topp.jsonl", 0, "k"),
    # x (temperature only) takes the slot w (three single-token bad words) left at step 3
    "sampling-bad-words-kept-on-slot-reuse": ("sampling_bias_badwords_mintokens.jsonl", 3, "x"),
    # f (frequency penalty 2) takes, at step 4, the slot plain left after four sampled tokens
    "penalties-counts-not-cleared-on-admission": ("sampling_penalties.jsonl", 4, "f"),
    # mt (min_tokens 4 after a 13-token prompt) first samples at step 1: its stop ids stay open
    "min-tokens-len-ignores-prompt": ("sampling_bias_badwords_mintokens.jsonl", 1, "mt"),
    # g1's bitmask row (listed first) lands on batch row 0, g2 (the shorter prefill): g2's row
    # keeps g1's few tokens, odd ones among them, outside g2's even-token grammar
    "grammar-mask-by-scheduler-position": ("sampling_grammar.jsonl", 0, "g2"),
    # p's prompt (40 tokens) completes at step 1 after a chunk of 24: its row of position 23 is lost
    "prompt-logprobs-chunk-loses-its-last-row": ("sampling_prompt_logprobs.jsonl", 1, "p"),
    # every request's prefill samples at step 0: its stored history ends at the prompt, without
    # the token it was given (r, fp and plain alike: the history of every request is judged)
    "history-length-never-advanced": ("sampling_penalties.jsonl", 0, "r,fp,plain"),
    # step 0 samples plain, t and l in one batch: each row's logprobs come from the row before
    # it (plain's from l's, the last), so all three are wrong
    "logprobs-from-the-previous-row": ("sampling_logprobs.jsonl", 0, "plain,t,l"),
    # step 1 verifies g's two drafts (rows 0-2), then s's two (rows 3-5) and plain (row 6): sliced
    # from their batch indices, s and plain are handed rows 1 and 2, g's
    "spec-logprobs-sliced-by-request-index": (SPEC_TRACE, 1, "s,plain"),
    # step 1 verifies b's two drafts, both kept: its draft rows unmasked, their argmax lies outside
    # b's five tokens and the first draft is rejected (the spec-decode outcome sees it first)
    "grammar-mask-drafts-on-first-row": (GRAMMAR_SPEC_TRACE, 1, "b"),
    # p (top_p 0.5, seed 7) first samples at step 1 in slot 0; replayed alone (seeds.py) it
    # samples in slot 3, the one a fresh runner hands out first: its first token differs
    "seed-stream-keyed-by-slot": ("sampling_temperature_topk_topp.jsonl", 1, "p"),
}


def test_the_family_is_in_the_catalogue_one_mutant_per_kind():
    assert set(FOUND_BY) == {m.name for m in SAMPLING}
    assert all(BY_NAME[m.name] is m and m in CATALOGUE for m in SAMPLING)
    assert not any(m.equivalent or m.control for m in SAMPLING)
    # routing, slot reuse, penalties history, min-tokens, grammar bitmask, prompt logprobs,
    # stored history, logprobs, logprobs under drafts: one module each; seeds share routing's (states),
    # the grammar under drafts the grammar's (structured_outputs)
    assert sorted(m.module.rsplit(".", 1)[1] for m in SAMPLING) == [
        "bad_words", "logit_bias", "model_runner", "penalties", "prompt_logprob", "rejection_sampler", "sampler",
        "states", "states", "structured_outputs", "structured_outputs"]
    assert {trace for trace, _, _ in FOUND_BY.values()} <= {*TRACES, SPEC_TRACE, GRAMMAR_SPEC_TRACE}


@pytest.mark.vllm
def test_the_unmutated_sampler_replays_the_sampling_traces_clean(tmp_path):
    """All six through ``simrig replay`` in a process of its own (memcheck on, as by
    default): exit 0, no class the oracle or the checker would call new."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "simrig", "replay", *(str(SAMPLES / t) for t in TRACES),
                           "--out", str(tmp_path / "out"), "--no-coverage"],
                          capture_output=True, text=True, timeout=600, cwd=SAMPLES.parents[1])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "no new finding classes" in proc.stdout


@pytest.mark.vllm
@pytest.mark.slow  # a child process per mutant: vLLM loaded, one trace replayed (~12 s each)
@pytest.mark.parametrize("name", sorted(FOUND_BY))
def test_a_replay_of_the_bundled_trace_finds_the_mutant(tmp_path, name):
    from simrig.selftest.mutant_runs import PHASE_TRACES, run_child

    trace, step, req = FOUND_BY[name]
    result = run_child(name, budget_s=0, seed=0, baseline=[], traces=[SAMPLES / trace],
                       out_dir=tmp_path, timeout_s=300)
    assert result.error == ""
    assert result.detected and result.phase == PHASE_TRACES, result
    assert result.signature[:3] == SIGNATURES.get(name, SIGNATURE)
    assert result.shrunk_steps == step + 1, result.message
    assert f"(requests {req})" in result.message


@pytest.mark.vllm
@pytest.mark.slow  # one mutant campaign in a child process, ~10 s
def test_counts_left_in_a_slot_are_found_by_the_valid_campaign(tmp_path):
    """The valid campaign alone (no bundled trace, no database, bounded by examples): its
    first example admits a request with penalties into a slot that held sampled tokens."""
    from simrig.selftest.mutant_runs import run_child

    result = run_child("penalties-counts-not-cleared-on-admission", budget_s=0, seed=0, baseline=[],
                       traces=[], out_dir=tmp_path, timeout_s=300, max_examples=2)
    assert result.error == ""
    assert result.detected and result.via == "fuzz:valid", result
    assert result.signature[:3] == SIGNATURE
    # a penalised value, not a support: the row's penalties read counts it never made
    assert "frequency_penalty" in result.message and ": value: token " in result.message, result.message
    assert result.examples_to_detection == 1
