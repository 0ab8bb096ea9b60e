"""The sampling oracle's judged values are decisions of the ledger (docs/decisions.md), and the
call sites that feed vLLM's sampler are judged through them or say why not, without resting
on the stand-in sampler (it samples only batches in which no request states parameters)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from simrig.ledger.call_rows import ROWS
from simrig.ledger.decisions import decisions
from simrig.observe import POSTPROCESS, FieldObs, StageObs, StepObs
from simrig.sampling.logits import SAMPLER_ENV
from simrig.sampling.params import SamplingSpec
from simrig.sampling_checks.oracle import SamplingOracle
from simrig.step import NewRequest, RunnerConfig, Step
from simrig.vllm_sampling.switch import SampledRows

VOCAB = 16
SAMPLING_FIELDS = {"sampler.processed_logits", "sampler.sampled_token", "output.sampled_token_ids",
                   "req_states.all_token_ids", "output.logprobs", "output.prompt_logprobs"}


def _listed(values: list) -> FieldObs:
    return FieldObs("list", "", (len(values),), values)


def test_every_field_a_sampling_finding_names_is_a_decision_judged_by_it(monkeypatch):
    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    # two requests with parameters, one step, every fault the oracle names: "a" asks for
    # logprobs (none come), its row is all zeros (not its spread row / 0.5), its handed token is
    # not the one sampled and its stored history is short; "b" draws a token outside its row
    # and gets prompt logprobs it never asked for
    step = Step(new_requests=[NewRequest("a", 4, sampling=SamplingSpec(temperature=0.5, logprobs=2)),
                              NewRequest("b", 4, sampling=SamplingSpec(temperature=0.5))],
                num_scheduled_tokens={"a": 4, "b": 4})
    row_b = np.full(VOCAB, -np.inf, dtype=np.float32)
    row_b[5] = 0.0
    calls = [SampledRows(np.stack([np.zeros(VOCAB, dtype=np.float32), row_b]), np.array([0, 3]), np.array([0, 1]))]
    obs = StepObs(0, stages=[StageObs(POSTPROCESS, fields={"output.req_ids": _listed(["a", "b"]),
                                                           "output.sampled_token_ids": _listed([[1], [3]])})])
    unasked = SimpleNamespace(logprob_token_ids=np.zeros((3, 1)), logprobs=np.zeros((3, 1)),
                              selected_token_ranks=np.ones(3))
    obs.sampled = {"rows": [(0, "a", 3), (1, "b", 3)], "calls": calls, "history": {"a": np.array([9])},
                   "logprobs": None, "prompt_logprobs": {"b": unasked}}
    found = SamplingOracle(RunnerConfig(), vocab_size=VOCAB).check(0, step, obs)
    assert {f.field for f in found} == SAMPLING_FIELDS
    assert {f.check for f in found} == {"sampling"} and {f.stage for f in found} == {POSTPROCESS}
    judged = {d.field: d.check for d in decisions() if d.path == "real step" and d.stage == POSTPROCESS}
    assert all("sampling" in (judged.get(name) or "") for name in SAMPLING_FIELDS), judged


@pytest.mark.parametrize("row, through", [
    (("post_update", "output_bin_counts"), "postprocess.sampler.processed_logits"),
    (("the sampler", "logits"), "postprocess.sampler.processed_logits"),
    (("the sampler", "input_batch"), "postprocess.sampler.processed_logits"),
    (("the async output", "sampler_output"), "postprocess.output.logprobs"),
    (("post_update", "self.req_states.all_token_ids.gpu"), "postprocess.req_states.all_token_ids"),
    (("post_update", "self.req_states.total_len.gpu"), "postprocess.req_states.all_token_ids"),
])
def test_what_feeds_the_sampler_is_judged_through_the_sampling_decisions(row, through):
    assert through in ROWS[row].judged_by


def test_no_reason_rests_on_the_stand_in_sampler_and_what_is_not_handed_on_says_so():
    assert [key for key, row in ROWS.items() if any(c.function == "GreedySampler" for c in row.evidence)] == []
    assert ROWS[("the scheduler's output", "prompt_logprobs_dict")].judged_by == (
        "postprocess.output.prompt_logprobs",)
    scores = ROWS[("the scheduler's output", "prompt_token_id_logprobs_dict")]
    assert scores.reason.startswith("not driven")
    assert any(c.file == "simrig/vllm_sampling/sampling_params.py" and c.absent for c in scores.evidence)
    # a grammar is driven with and without drafts (judged by the grammar rule and the reference's
    # mask stage); a P/D step's placeholder drafts of a grammar request are the rejection
    # sampler's invalid drafts, whose outcome the spec-decode counts and tokens judge
    assert {"postprocess.sampler.grammar_mask", "postprocess.sampler.processed_logits"} <= set(
        ROWS[("sample", "grammar_output")].judged_by)
    assert ROWS[("the rejection sampler", "invalid_drafts")].judged_by == (
        "postprocess.num_sampled", "postprocess.output.sampled_token_ids")
