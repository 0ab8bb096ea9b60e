"""Micro-batching (DBO): the split decision, the micro-batches and the uniform_decode flag.

The real vLLM splits the batch each step ran (simrig.vllm_parts.ubatch); the oracle
(simrig.graph_rules.ubatch_split) holds the micro-batches to the partition vLLM's comments
describe. Faults are seeded into observations (the judge must fail on them) and into
vLLM itself, in a child process (the selftest mutant).
"""

from __future__ import annotations

import copy
import dataclasses
import sys

import numpy as np
import pytest

from simrig.checks.checker import Checker
from simrig.harness import Harness
from simrig.observe import FieldObs, StepObs
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace_format import config_to_json, parse_header
from tests import mutant_cli

DBO = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=256, num_ubatches=2,
                   dbo_decode_token_threshold=2, dbo_prefill_token_threshold=6,
                   cudagraph_mode="FULL", capture_sizes=(4, 8, 16, 32, 64))


def dbo_steps() -> list[Step]:
    """Prefills straddling the split, a padded decode, chunked prefill next to decodes."""
    return [
        Step(new_requests=[NewRequest("a", 9), NewRequest("b", 5), NewRequest("c", 30)],
             num_scheduled_tokens={"a": 9, "b": 5, "c": 12}),
        Step(cached=[CachedUpdate("a", 9), CachedUpdate("b", 5), CachedUpdate("c", 12)],
             num_scheduled_tokens={"a": 1, "b": 1, "c": 18}),
        Step(cached=[CachedUpdate("a", 10), CachedUpdate("b", 6), CachedUpdate("c", 30)],
             num_scheduled_tokens={"a": 1, "b": 1, "c": 1}),
        Step(finished=["b"], new_requests=[NewRequest("d", 7)],
             cached=[CachedUpdate("a", 11), CachedUpdate("c", 31)],
             num_scheduled_tokens={"a": 1, "c": 1, "d": 7}),
    ]


def _check(config: RunnerConfig, steps: list[Step], observations: list[StepObs]) -> list:
    checker = Checker(config, trace="test")
    return [f for i, (s, o) in enumerate(zip(steps, observations)) for f in checker.check(i, s, o)
            if f.check == "ubatch"]


@pytest.fixture(scope="module")
def dbo_run(vllm_api) -> list[StepObs]:
    harness = Harness(DBO, api=vllm_api)
    return [harness.run_step(s) for s in dbo_steps()]


def test_the_config_axis_round_trips_and_is_refused_where_vllm_refuses_dbo():
    header = {"format": "simrig-trace", "version": 1, "config": config_to_json(DBO), "source": {}}
    from simrig.trace_io.trace_format import FORMAT_NAME, FORMAT_VERSION
    header.update(format=FORMAT_NAME, version=FORMAT_VERSION)
    assert parse_header(header, "t.jsonl").config == DBO
    assert "num_ubatches" not in config_to_json(RunnerConfig())  # old traces read and write as before
    for change, word in ((dict(num_speculative_tokens=1), "speculative"), (dict(dcp_size=2), "context"),
                         (dict(max_loras=1), "LoRA"), (dict(cudagraph_mode="PIECEWISE"), "PIECEWISE"),
                         (dict(dbo_decode_token_threshold=1), "at least")):
        with pytest.raises(ValueError, match=word):
            dataclasses.replace(DBO, **change).validate()


@pytest.mark.vllm
def test_vllm_splits_and_every_micro_batch_is_a_partition(dbo_run):
    split = [o.get("ubatch") for o in dbo_run]
    assert all(s is not None and s.error is None for s in split)
    counts = [int(s.fields["desc.num_ubatches"].values) for s in split]
    # 26 and 20 prefill tokens >= 6 split; 3 uniform decodes >= 2 split; 9 tokens with a prefill split
    assert counts == [2, 2, 2, 2]
    assert _check(DBO, dbo_steps(), dbo_run) == []
    # a request straddles the split of the first step: it is in both micro-batches
    ids = split[0].fields["req_ids"].values
    assert set(ids[0]) & set(ids[1])
    flags = [bool(o.get("dispatch").fields["uniform_decode"].values) for o in dbo_run]
    assert flags == [False, False, True, False]


@pytest.mark.vllm
@pytest.mark.parametrize("field, edit, rule", [
    ("seq_lens", lambda v: [[x + 1 for x in v[0]], v[1]], "SEQ LENS"),
    ("num_scheduled_tokens", lambda v: [v[0], [x + 1 for x in v[1]]], "REQUESTS"),
    ("slice.tokens", lambda v: [[0, v[0][1] - 1], v[1]], "TOKENS"),
    ("req_ids", lambda v: [v[0][:-1], v[1]], "REQUESTS"),
    ("positions", lambda v: [v[0][::-1], v[1]], "TOKENS"),
])
def test_a_wrong_micro_batch_is_a_finding(dbo_run, field, edit, rule):
    observations = list(dbo_run)
    step = copy.deepcopy(observations[0])
    stage = step.get("ubatch")
    stage.fields[field] = dataclasses.replace(stage.fields[field], values=edit(stage.fields[field].values))
    observations[0] = step
    found = _check(DBO, dbo_steps(), observations)
    assert found and all(f.step == 0 and f.stage == "ubatch" for f in found), rule


@pytest.mark.vllm
def test_the_decision_and_the_uniform_decode_flag_are_judged(dbo_run):
    observations = list(dbo_run)
    step = copy.deepcopy(observations[2])  # three decodes of one token: a uniform decode
    step.get("dispatch").fields["uniform_decode"] = FieldObs("scalar", "bool", (), False)
    step.get("ubatch").fields["desc.num_ubatches"] = FieldObs("scalar", "int", (), 1)
    observations[2] = step
    found = {(f.step, f.field) for f in _check(DBO, dbo_steps(), observations)}
    assert found == {(2, "uniform_decode"), (2, "desc.num_ubatches")}


def test_a_batch_of_exactly_the_threshold_may_go_either_way():
    """The field docs say "greater than", the validator keeps a batch below it out."""
    from simrig.graph_rules.ubatch_split import check_ubatches

    config = dataclasses.replace(DBO, cudagraph_mode="NONE", capture_sizes=())
    q, pre = np.array([3, 3]), np.array([True, True])
    for n in (1, 2):
        obs = StepObs(index=0)
        from simrig.observe import StageObs
        obs.stages.append(StageObs(stage="ubatch", fields={"desc.num_ubatches": FieldObs("scalar", "int", (), n)}))
        assert check_ubatches(0, config, obs, q, pre, ~pre) == []
        below = check_ubatches(0, config, obs, np.array([2, 3]), pre, ~pre)
        assert bool(below) == (n == 2)


def main(mutant: str) -> int:
    """The DBO steps' fields that disagree, printed, under ``mutant`` (``-``: none); called in a
    process of its own (tests/mutant_cli.py), since a mutant cannot be taken back."""
    from simrig.adapters.runner import load
    from simrig.selftest.catalogue import BY_NAME
    from simrig.vllm_runtime import mutate

    load()
    if mutant != "-":
        mutate.apply(BY_NAME[mutant])
    h = Harness(DBO)
    steps = dbo_steps()
    print(sorted({f.field for f in _check(DBO, steps, [h.run_step(s) for s in steps])}))
    return 0


@pytest.mark.vllm
@pytest.mark.slow
def test_the_catalogue_mutant_is_caught():
    out = {}
    for name in ("-", "ubatch-seq-lens-truncate-first"):
        proc = mutant_cli.run([], name, module="tests.test_ubatch")
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[name] = proc.stdout.strip().splitlines()[-1]
    assert out["-"] == "[]"
    assert "seq_lens" in out["ubatch-seq-lens-truncate-first"]


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
