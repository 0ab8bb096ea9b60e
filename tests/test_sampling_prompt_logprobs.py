"""Prompt logprobs: the stand-in model's hidden states name their tokens, so any row gets its
logits (simrig/vllm_sampling/token_names.py), and the oracle (simrig/sampling_checks/
prompt_logprobs.py) holds each request's prompt rows to their meaning, on tiny hand-made
examples; then the bundled trace through vLLM, clean at PCP 1, 2 and 4 and under FULL graphs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from simrig.observe import StepObs
from simrig.sampling.logits import SAMPLER_ENV, spread_logits
from simrig.sampling.params import SamplingSpec
from simrig.sampling_checks.prompt_logprobs import FIELD, PromptLogprobsCheck
from simrig.step import SYNTH_VOCAB_SIZE, CachedUpdate, NewRequest, Step, synth_token
from simrig.vllm_sampling.token_names import SpreadRows, TokenNames, token_names

ASK_ONE = SamplingSpec(prompt_logprobs=1)


# ------------------------------------------------------------ names and logits
def test_each_token_is_named_by_its_slot_and_position_and_padding_by_zeros():
    import torch  # lazy: only these two tests build tensors

    batch = SimpleNamespace(num_reqs=2, query_start_loc_np=np.array([0, 2, 5]), idx_mapping_np=np.array([3, 1]),
                            positions=torch.tensor([7, 8, 0, 1, 2, 0]))
    assert token_names(batch, 6).tolist() == [[1, 3, 7], [1, 3, 8], [1, 1, 0], [1, 1, 1], [1, 1, 2], [0, 0, 0]]


def test_any_named_row_gets_its_requests_logits_and_the_logit_rows_stay_as_before():
    import torch  # lazy: only these two tests build tensors

    names = TokenNames(torch, "cpu", 8)
    names.req_states = SimpleNamespace(index_to_req_id={3: "a", 1: "b"})
    hidden = torch.zeros(3, 8)
    hidden[0, :3] = torch.tensor([1.0, 3.0, 7.0])  # a (spread) at position 7
    hidden[1, :3] = torch.tensor([1.0, 1.0, 1.0])  # b (one-hot rows) at position 1
    spread = SpreadRows({}, {"a"})
    tokens = np.array([42])  # the batch has one logit row
    first = names.logits(hidden[:1], tokens, SYNTH_VOCAB_SIZE, spread).numpy()
    assert first[0, 42] == 0.0 and np.isinf(first[0]).sum() == SYNTH_VOCAB_SIZE - 1  # the harness's row
    rows = names.logits(hidden, tokens, SYNTH_VOCAB_SIZE, spread).numpy()
    assert np.array_equal(rows[0], spread_logits("a", 7, SYNTH_VOCAB_SIZE))
    assert rows[1, synth_token("b", 2)] == 0.0 and np.isinf(rows[1]).sum() == SYNTH_VOCAB_SIZE - 1
    assert not rows[2].any()  # padding
    # once served, the same row count is named by the hidden states (a prompt chunk as long)
    again = names.logits(hidden[:1], tokens, SYNTH_VOCAB_SIZE, spread).numpy()
    assert np.array_equal(again[0], spread_logits("a", 7, SYNTH_VOCAB_SIZE))


# ------------------------------------------------------------ the oracle, one-hot rows
def _one_hot_rows(req_id: str, positions: range, k: int = 1) -> SimpleNamespace:
    """Rows of a one-hot prompt (the token rule): at position p the prompt token p + 1 holds
    the whole mass, logprob 0 and rank 1; the most likely token is that same token."""
    ids = np.array([[synth_token(req_id, p + 1)] * (k + 1) for p in positions])
    return SimpleNamespace(logprob_token_ids=ids, logprobs=np.zeros(ids.shape), selected_token_ranks=np.ones(len(ids)))


def _seen(rows: dict) -> StepObs:
    obs = StepObs(0)
    obs.sampled = {"rows": [], "calls": [], "history": {}, "logprobs": None, "prompt_logprobs": rows}
    return obs


def _one_hot_check() -> PromptLogprobsCheck:
    return PromptLogprobsCheck(num_speculative_tokens=1, vocab_size=SYNTH_VOCAB_SIZE)  # drafts: one-hot rows


CHUNK_0 = Step(new_requests=[NewRequest("a", 4, sampling=ASK_ONE)], num_scheduled_tokens={"a": 2})
CHUNK_1 = Step(cached=[CachedUpdate("a", 2)], num_scheduled_tokens={"a": 2})


@pytest.mark.parametrize("first, second", [((0, 2), (2, 3)),   # a row per chunk
                                           ((0, 0), (0, 3))])  # all at the end (vLLM 0.33)
def test_a_four_token_prompt_has_three_rows_in_order_however_they_arrive(first, second):
    check = _one_hot_check()
    got0 = {"a": _one_hot_rows("a", range(*first))} if first[1] else {}
    assert check.check(0, CHUNK_0, _seen(got0)) == []
    assert check.check(1, CHUNK_1, _seen({"a": _one_hot_rows("a", range(*second))})) == []


def test_a_row_lost_at_a_chunk_boundary_shifts_the_next_one_and_is_found():
    check = _one_hot_check()
    assert check.check(0, CHUNK_0, _seen({"a": _one_hot_rows("a", range(0, 1))})) == []  # position 1 lost
    found = check.check(1, CHUNK_1, _seen({"a": _one_hot_rows("a", range(2, 3))}))
    assert [(f.field, f.req_ids, f.expected, f.actual) for f in found] == [
        (FIELD, ("a",), f"position 1: prompt token {synth_token('a', 2)}", f"token {synth_token('a', 3)}")]


def test_rows_missing_when_the_prompt_completes_are_found():
    check = _one_hot_check()
    assert check.check(0, CHUNK_0, _seen({})) == []
    found = check.check(1, CHUNK_1, _seen({"a": _one_hot_rows("a", range(0, 2))}))
    assert [(f.expected, f.actual) for f in found] == [("rows to position 2", "rows to position 1")]


def test_rows_for_a_position_not_yet_computed_are_found():
    check = _one_hot_check()
    found = check.check(0, CHUNK_0, _seen({"a": _one_hot_rows("a", range(0, 3))}))
    assert [(f.expected, f.actual) for f in found] == [("positions 0 .. 1", "positions 0 .. 2")]


def test_no_rows_for_a_request_that_did_not_ask_or_resumed_after_its_prompt():
    check = _one_hot_check()
    step = Step(new_requests=[NewRequest("b", 4, sampling=SamplingSpec(temperature=0.5)),
                              NewRequest("r", 4, prefill_len=6, sampling=ASK_ONE)],
                num_scheduled_tokens={"b": 4, "r": 6})
    found = check.check(0, step, _seen({"b": _one_hot_rows("b", range(3)), "r": _one_hot_rows("r", range(3))}))
    assert sorted((f.req_ids, f.expected) for f in found) == [
        (("b",), "none (it did not ask)"), (("r",), "none")]
    assert check.check(1, Step(cached=[CachedUpdate("b", 4), CachedUpdate("r", 6)],
                               num_scheduled_tokens={"b": 1, "r": 1}), _seen({})) == []


def test_a_prompt_preempted_before_it_completes_starts_over():
    check = _one_hot_check()
    assert check.check(0, CHUNK_0, _seen({})) == []
    assert check.check(1, Step(preempted=["a"]), _seen({})) == []
    again = Step(new_requests=[NewRequest("a", 4, sampling=ASK_ONE)], num_scheduled_tokens={"a": 4})
    assert check.check(2, again, _seen({"a": _one_hot_rows("a", range(3))})) == []


# ------------------------------------------------------------ the oracle, spread rows
def _spread_rows(req_id: str, prompt: list[int], positions: range, k: int, vocab: int) -> SimpleNamespace:
    ids, vals, ranks = [], [], []
    for p in positions:
        raw = spread_logits(req_id, p, vocab).astype(np.float64)
        logp = raw - np.log(np.exp(raw).sum())
        top = list(np.argsort(-logp)[:k])
        ids.append([prompt[p + 1], *top])
        vals.append([logp[prompt[p + 1]], *logp[top]])
        ranks.append(1 + int((logp > logp[prompt[p + 1]]).sum()))
    return SimpleNamespace(logprob_token_ids=np.array(ids), logprobs=np.array(vals, dtype=np.float32),
                           selected_token_ranks=np.array(ranks))


def test_spread_rows_are_the_log_softmax_of_the_raw_row_within_the_tolerance(monkeypatch):
    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    prompt = [1, 5, 2, 7]
    step = Step(new_requests=[NewRequest("s", 4, prompt_token_ids=prompt, sampling=SamplingSpec(prompt_logprobs=2))],
                num_scheduled_tokens={"s": 4})
    rows = _spread_rows("s", prompt, range(3), 2, 8)
    assert PromptLogprobsCheck(0, 8).check(0, step, _seen({"s": rows})) == []
    rows.logprobs[1, 0] += 0.01  # position 1's prompt token, 1e-2 off
    found = PromptLogprobsCheck(0, 8).check(0, step, _seen({"s": rows}))
    assert [f.expected.split(":")[0] for f in found] == ["position 1"]
    narrow = _spread_rows("s", prompt, range(3), 1, 8)  # one most likely token where two are asked
    found = PromptLogprobsCheck(0, 8).check(0, step, _seen({"s": narrow}))
    assert [(f.expected, f.actual) for f in found] == [("3 columns", "2 columns")]


# ------------------------------------------------------------ through vLLM
@pytest.mark.vllm
@pytest.mark.slow  # three replays of a seven-step trace, ~25 s
@pytest.mark.parametrize("args", [["--pcp-sizes", "1,2,4"], ["--cudagraph-mode", "FULL"]])
def test_the_bundled_trace_replays_clean_under_pcp_and_full_graphs(tmp_path, args):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "simrig", "replay", "traces/samples/sampling_prompt_logprobs.jsonl",
                           *args, "--out", str(tmp_path / "out"), "--no-coverage"],
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "no new finding classes" in proc.stdout


@pytest.mark.vllm
def test_vllm_hands_every_prompt_row_once_for_the_requests_that_ask(vllm_api):
    """The bundled trace through the harness: p's 39 rows (3 + 1 columns) when its prompt
    completes at step 1, w's 19 (the whole vocabulary + 1) at step 3 after its restart,
    nothing for n and plain, nothing for p's resumption."""
    from pathlib import Path

    from simrig.harness import Harness
    from simrig.trace_io.trace import TraceReader

    reader = TraceReader(Path(__file__).resolve().parents[1] / "traces/samples/sampling_prompt_logprobs.jsonl")
    harness = Harness(reader.header.config, api=vllm_api)
    shapes = {}
    for i, (_, step) in enumerate(reader):
        got = harness.run_step(step).sampled["prompt_logprobs"] or {}
        shapes.update({(i, r): tuple(rows.logprobs.shape) for r, rows in got.items()})
    assert shapes == {(1, "p"): (39, 4), (3, "w"): (19, SYNTH_VOCAB_SIZE + 1)}
