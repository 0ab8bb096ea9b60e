"""The PP axis: pp_size in the trace config, the scheduler model's interval, and the
non-last PP rank driven through the real vLLM and judged against the last rank."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from simrig.checks.checker import Checker
from simrig.checks.pp_ranks import PP_DECODE_INTERVAL
from simrig.findings import findings as fk
from simrig.observe import PIPELINE, StepObs
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import read_trace
from simrig.trace_io.trace_format import config_to_json
from strategies.model import Plan, Row, SchedulerModel
from tests import mutant_cli

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "pp2_spec.jsonl"


def test_pp_size_is_validated_and_written_only_when_not_one(tmp_path):
    with pytest.raises(ValueError, match="pp_size"):
        RunnerConfig(pp_size=0).validate()
    assert "pp_size" not in config_to_json(RunnerConfig())
    assert config_to_json(RunnerConfig(pp_size=2))["pp_size"] == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format":"simrig-trace","version":1,"config":{"pp_size":0}}\n'
                   '{"step":0,"new_requests":[{"id":"a","prompt_len":4}],"num_scheduled_tokens":{"a":4}}\n')
    with pytest.raises(Exception, match=r"config\.pp_size"):
        read_trace(bad)
    header, steps = read_trace(FIXTURE)
    assert header.config.pp_size == 2 and len(steps) == 7


def test_the_scheduler_model_keeps_the_pp_interval_and_may_send_an_empty_step():
    model = SchedulerModel(RunnerConfig(max_num_reqs=2, max_num_batched_tokens=32, max_model_len=64,
                                        pp_size=2))
    a = model.arrive(8, max_tokens=4)
    model.build_step(Plan([Row(a, 8)]))  # step 0: a's prefill samples
    req = model.reqs[a]
    assert not model.can_schedule(req) and model.cooling() == [req]
    step = model.build_step(Plan([]))  # step 1: nothing runs, the ring advances
    assert step.num_scheduled_tokens == {}
    assert model.can_schedule(req) and model.cooling() == []
    model.build_step(Plan([Row(a, 1)]))  # step 2: a decodes
    assert not model.can_schedule(req)


def test_a_request_scheduled_inside_the_interval_breaks_the_contract():
    config = RunnerConfig(max_num_reqs=2, max_num_batched_tokens=32, max_model_len=64, pp_size=2)
    checker = Checker(config, trace="t")
    steps = [Step(new_requests=[NewRequest("a", 8, block_ids=[1])], num_scheduled_tokens={"a": 8}),
             Step(cached=[CachedUpdate("a", 8)], num_scheduled_tokens={"a": 1})]
    found = [f for i, s in enumerate(steps) for f in checker.pipeline.check(i, s, StepObs(index=i))]
    assert [(f.kind, f.field, f.step) for f in found] == [
        (fk.CONTRACT_VIOLATION_INPUT, PP_DECODE_INTERVAL, 1)]


@pytest.fixture(scope="module")
def pp_run(vllm_api):
    from simrig.harness import Harness

    header, steps = read_trace(FIXTURE)
    harness = Harness(header.config, api=vllm_api)
    return header.config, steps, [harness.run_step(s) for s in steps]


def _findings(config, steps, observations):
    checker = Checker(config, trace="test")
    return [f for i, (s, o) in enumerate(zip(steps, observations)) for f in checker.check(i, s, o)
            if not f.known and f.kind != fk.RIG_ERROR]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_non_last_rank_matches_the_last_rank(pp_run):
    config, steps, observations = pp_run
    assert _findings(config, steps, observations) == []
    records = [o.get(PIPELINE, 0) for o in observations]
    assert all(r is not None and r.error is None for r in records)
    # the first decodes (steps 2 and 3) run on tokens the non-last rank received two steps before
    assert records[2].fields["batch.input_ids"].values.tolist()[0] == \
        records[2].fields["last.input_ids"].values.tolist()[0]
    # r2's only sample reaches its max_tokens: either answer; r1's first chunk is never marked
    assert records[0].fields["need_sampled_mask"].values == [True, False]
    assert records[5].fields["broadcasts.sent"].values == 0  # the empty step sends nothing


def _changed(observations, index, name, fn):
    out = list(observations)
    out[index] = copy.deepcopy(observations[index])
    record = out[index].get(PIPELINE, 0)
    field = record.fields[name]
    record.fields[name] = dataclasses.replace(field, values=fn(field.values))
    return out


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("index, name, fn", [
    (0, "need_sampled_mask", lambda v: [False, False]),  # r0 samples and goes on: must be marked
    (0, "need_sampled_mask", lambda v: [True, True]),  # r1's non-final chunk samples nothing
    (2, "num_computed_tokens", lambda v: np.asarray(v) - 1),
    (2, "last.num_computed_tokens", lambda v: np.asarray(v) + 1),
    (2, "batch.input_ids", lambda v: np.concatenate([[int(v[0]) + 1], np.asarray(v)[1:]])),
    (4, "batch.input_ids", lambda v: np.concatenate([np.asarray(v)[:-1], [int(v[-1]) + 1]])),  # a draft
    (3, "broadcasts.unreceived", lambda v: 1),
    (1, "broadcasts.sent", lambda v: 0),
])
def test_a_changed_pipeline_field_is_a_finding(pp_run, index, name, fn):
    config, steps, observations = pp_run
    found = _findings(config, steps, _changed(observations, index, name, fn))
    fields = {f.field for f in found if f.stage == PIPELINE and f.step == index}
    expected = {"batch.input_ids": {"input_ids", "draft_tokens"}}.get(name, {name})
    assert fields & expected, [f.one_line() for f in found]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("mutant, fields", [
    ("pp-mask-drops-continuing-prefill", {"need_sampled_mask", "input_ids"}),
    ("pp-non-last-skips-optimistic-update", {"num_computed_tokens"}),
])
def test_each_pp_mutant_is_found_on_the_fixture(tmp_path, mutant, fields):
    """Seeded in a child process (a mutant is irreversible): the replay fails with the
    pipeline check's classes."""
    import pandas as pd

    out = tmp_path / mutant
    proc = mutant_cli.run(["replay", str(FIXTURE), "--out", str(out), "--quiet", "--no-coverage"], mutant)
    assert (out / "classes.csv").is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    new = classes[(classes["verdict"] == "new") & (classes["stage"] == PIPELINE)]
    assert proc.returncode == 1 and fields <= set(new["field"]), classes.to_string()


@pytest.mark.vllm
@pytest.mark.slow
def test_a_reused_pp_runner_observes_exactly_what_a_fresh_one_does(vllm_api):
    """The non-last rank's runner and the broadcast mailbox are part of the state a
    reused runner puts back (simrig.runners)."""
    from simrig.harness import Harness
    from simrig.runners import RunnerPool
    from tests.test_runner_reuse import observed

    header, steps = read_trace(FIXTURE)
    pool = RunnerPool()
    pool.prefer_reuse(header.config, api=vllm_api)
    first = pool.acquire(header.config, api=vllm_api)
    fresh = observed(Harness(first.config, api=vllm_api), steps)
    observed(first, steps)
    assert pool.release(first), pool.last_dirty
    again = pool.acquire(header.config, api=vllm_api)
    assert again is first
    assert observed(again, steps) == fresh


@pytest.mark.vllm
def test_a_held_request_readmitted_under_pp_and_pcp_is_no_new_class():
    """The adversarial campaign's shrunk trace (kept verbatim): `r0` admitted again while held,
    its final prefill's only sample at its length cap, PP 2 with PCP 2. On 0.30.0-0.31.0 the
    non-last rank receives a broadcast the last rank never sent, a known entry of the runner
    check (the exception comes at a violation step); on 0.32.0+ nothing is raised."""
    from simrig.replay import replay_trace  # lazy: imports vLLM

    result = replay_trace(ROOT / "tests" / "fixtures" / "pp_pcp_readmitted_broadcast.jsonl")
    assert set(result.findings["verdict"]) <= {"known", "expected"}
    raised = result.findings[result.findings["exception_type"] == "PipelineBroadcastError"]
    assert all(by.endswith("known-findings.json#73") for by in raised["known_by"])
