"""The LoRA axis: trace fields, bad values, the oracle's rules, strategies, and a
replay through the real vLLM whose dispatch runs each batch on its LoRA case.

Expected values are pinned by hand from the meaning of the fields
(simrig/graph_rules/lora_dispatch.py cites them), never taken from the run being checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simrig.checks.checker import Checker
from simrig.graph_rules.lora_dispatch import AdapterTracker, capture_cases, check_lora_dispatch, dispatch_case
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceError, TraceHeader, read_trace, write_trace
from strategies import runner_configs, scheduler_steps

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "samples" / "lora_two_adapters.jsonl"
LORA = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128,
                    cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(4, 8, 16, 32), max_loras=2)


# ------------------------------------------------------------------ trace format
def test_lora_fields_round_trip(tmp_path):
    config = RunnerConfig(max_loras=3, specialize_active_lora=True, cudagraph_specialize_lora=False)
    steps = [Step(new_requests=[NewRequest("a", 4, lora_id=2), NewRequest("b", 3)],
                  num_scheduled_tokens={"a": 4, "b": 3})]
    path = tmp_path / "t.jsonl"
    write_trace(path, TraceHeader(config=config), steps)
    header, read = read_trace(path)
    assert header.config == config
    assert [r.lora_id for r in read[0].new_requests] == [2, None]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["config"]["max_loras"] == 3
    assert "lora_id" not in lines[1]["new_requests"][1]  # the base model: omitted


def test_a_trace_without_lora_is_written_as_before(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, TraceHeader(), [Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})])
    text = path.read_text()
    for key in ("max_loras", "specialize_active_lora", "cudagraph_specialize_lora", "lora_id"):
        assert key not in text


HEADER = {"format": "simrig-trace", "version": 1, "config": {"max_loras": 2}}
NEW = {"id": "a", "prompt_len": 4}


@pytest.mark.parametrize("header, step, message", [
    ({**HEADER, "config": {"max_loras": -1}}, None, "bad.jsonl:1: config.max_loras: must be >= 0, got -1"),
    ({**HEADER, "config": {"max_loras": True}}, None, "bad.jsonl:1: config.max_loras: must be an integer"),
    ({**HEADER, "config": {"max_loras": 2, "specialize_active_lora": "yes"}}, None,
     "bad.jsonl:1: config.specialize_active_lora: must be true or false, got 'yes'"),
    ({**HEADER, "config": {"cudagraph_specialize_lora": 0}}, None,
     "bad.jsonl:1: config.cudagraph_specialize_lora: must be true or false, got 0"),
    (HEADER, {"new_requests": [{**NEW, "lora_id": 0}], "num_scheduled_tokens": {"a": 4}},
     "bad.jsonl:2: new_requests[0].lora_id: must be >= 1, got 0"),
    (HEADER, {"new_requests": [{**NEW, "lora_id": "one"}], "num_scheduled_tokens": {"a": 4}},
     "bad.jsonl:2: new_requests[0].lora_id: must be an integer, got str 'one'"),
    ({**HEADER, "config": {}}, {"new_requests": [{**NEW, "lora_id": 1}], "num_scheduled_tokens": {"a": 4}},
     "bad.jsonl:2: new_requests[0].lora_id: LoRA is off (config.max_loras is 0)"),
    (HEADER, {"new_requests": [{**NEW, "lora_id": 1}, {"id": "b", "prompt_len": 4, "lora_id": 2},
                               {"id": "c", "prompt_len": 4, "lora_id": 3}],
              "num_scheduled_tokens": {"a": 4, "b": 4, "c": 4}},
     "bad.jsonl:2: num_scheduled_tokens: the batch holds 3 LoRA adapters [1, 2, 3], config.max_loras is 2"),
])
def test_bad_lora_values_name_file_line_and_field(tmp_path, header, step, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(obj) for obj in (header, step) if obj is not None) + "\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value).replace(str(tmp_path) + "/", "").startswith(message)


def test_a_bad_lora_value_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(
        {"new_requests": [{**NEW, "lora_id": 0}], "num_scheduled_tokens": {"a": 4}}) + "\n")
    run = subprocess.run([sys.executable, "-m", "simrig", "replay", "--no-coverage", str(path), "--out", str(tmp_path / "out")],
                         check=False, capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "bad.jsonl:2: new_requests[0].lora_id" in lines[0]
    assert "Traceback" not in run.stderr


# ------------------------------------------------------------------ the oracle's rules
@pytest.mark.parametrize("kwargs, cases", [
    ({}, [0]),
    ({"max_loras": 2}, [0, 3]),
    ({"max_loras": 2, "specialize_active_lora": True}, [0, 1, 2, 3]),
    ({"max_loras": 3, "specialize_active_lora": True}, [0, 1, 2, 4]),
    ({"max_loras": 5, "specialize_active_lora": True}, [0, 1, 2, 4, 6]),
    ({"max_loras": 2, "cudagraph_specialize_lora": False}, [3]),
    ({"max_loras": 3, "specialize_active_lora": True, "cudagraph_specialize_lora": False}, [4]),
])
def test_capture_cases_from_the_documented_switches(kwargs, cases):
    assert capture_cases(RunnerConfig(**kwargs)) == cases


@pytest.mark.parametrize("kwargs, active, case", [
    ({}, 0, 0), ({"max_loras": 2}, 0, 0), ({"max_loras": 2}, 1, 3), ({"max_loras": 2}, 2, 3),
    ({"max_loras": 5, "specialize_active_lora": True}, 3, 4),
    ({"max_loras": 5, "specialize_active_lora": True}, 5, 6),
    ({"max_loras": 2, "cudagraph_specialize_lora": False}, 0, 3),
])
def test_dispatch_case_is_the_smallest_capture_case_that_serves_the_count(kwargs, active, case):
    assert dispatch_case(RunnerConfig(**kwargs), active) == case


def test_adapters_are_counted_per_batch_and_leave_with_their_request():
    tracker = AdapterTracker()
    tracker.apply(Step(new_requests=[NewRequest("a", 2, lora_id=1), NewRequest("b", 2, lora_id=1),
                                     NewRequest("c", 2, lora_id=2), NewRequest("d", 2)]))
    assert tracker.num_active(["a", "b", "c", "d"]) == 2
    assert tracker.num_active(["a", "b", "d"]) == 1
    tracker.apply(Step(finished=["c"], preempted=["a"]))
    assert tracker.num_active(["a", "b", "c"]) == 1
    tracker.apply(Step(new_requests=[NewRequest("a", 2)]))  # re-sent without an adapter
    assert tracker.num_active(["a", "d"]) == 0


def test_a_wrong_case_is_a_finding_and_the_unspecialized_one_has_its_pattern():
    desc = {"cg_mode": "NONE", "num_tokens": 3, "num_active_loras": 0}
    found = check_lora_dispatch(0, RunnerConfig(max_loras=2), desc, 1, ("a",))
    assert [(f.field, f.expected, f.actual) for f in found] == [("num_active_loras", "3", "0")]
    unspec = check_lora_dispatch(0, RunnerConfig(max_loras=2, cudagraph_specialize_lora=False), desc, 0)
    assert [f.extra.get("pattern") for f in unspec] == ["lora_free_graph_unspecialized"]
    assert check_lora_dispatch(0, RunnerConfig(max_loras=2), desc, 0) == []


# ------------------------------------------------------------------ strategies
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_strategies_draw_lora_configs_and_adapters_within_max_loras(data):
    config = data.draw(runner_configs(max_loras=st.integers(1, 3), pcp_sizes=st.just(1),
                                      num_ubatches=st.just(1)))  # DBO turns LoRA off
    assert 1 <= config.max_loras <= 3
    steps = data.draw(scheduler_steps(config=st.just(config), min_steps=1, max_steps=6))
    tracker = AdapterTracker()
    for step in steps:
        tracker.apply(step)
        assert all(r.lora_id is None or 1 <= r.lora_id <= config.max_loras for r in step.new_requests)
        assert tracker.num_active(step.req_ids) <= config.max_loras


def test_the_default_config_strategy_sometimes_draws_lora():
    seen: set[bool] = set()

    @settings(max_examples=80, deadline=None, database=None, derandomize=True)
    @given(runner_configs())
    def draw(config):
        seen.add(config.max_loras > 0)

    draw()
    assert seen == {True, False}


# ------------------------------------------------------------------ real vLLM
@pytest.mark.vllm
def test_the_sample_dispatches_each_batch_on_its_lora_case(vllm_api):
    from simrig.harness import Harness

    header, steps = read_trace(SAMPLE)
    assert header.config == LORA
    harness = Harness(header.config, api=vllm_api)
    checker = Checker(header.config, trace=str(SAMPLE))
    cases, findings = [], []
    for index, step in enumerate(steps):
        obs = harness.run_step(step)
        if index == 0:  # capture before step 0: every shape at cases 0 and max_loras + 1
            captured = {st.fields["desc.num_active_loras"].values for st in obs.all("capture")}
            assert captured == {0, 3}
            # step 0's own activation: the dummy run after it activates once more (last)
            step0_activation = harness.runner.lora_manager.activations[-2]
        cases.append(obs.get("dispatch").fields["num_active_loras"].values)
        findings += [f for f in checker.check(index, step, obs) if f.check.startswith("lora")]
    # adapters in the batch: a:1 b:2 (+c) | a b c | a c | c  -> counts 2, 2, 1, 0
    assert cases == [3, 3, 3, 0]
    assert findings == []
    # the runner's own _set_active_loras handed the manager stand-in the real batch's mapping
    adapters, mapping = step0_activation
    assert adapters == [1, 2]
    assert Counter(int(i) for i in mapping.index_mapping) == Counter({1: 10, 2: 6, 0: 5})


@pytest.mark.vllm
def test_specialized_counts_dispatch_to_their_own_case(vllm_api):
    from simrig.harness import Harness

    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=32, max_model_len=64, max_loras=3,
                          specialize_active_lora=True)  # eager: cases 0, 1, 2, 4
    harness = Harness(config, stages=("gather",), api=vllm_api)
    first = Step(new_requests=[NewRequest("a", 3, lora_id=1), NewRequest("b", 3, lora_id=2),
                               NewRequest("c", 3, lora_id=3)], num_scheduled_tokens={"a": 3, "b": 3, "c": 3})
    got = [harness.run_step(first).get("dispatch").fields["num_active_loras"].values]
    for ids in (("a", "b"), ("a",)):
        step = Step(cached=[CachedUpdate(r, 3 + (len(got) > 1)) for r in ids],
                    num_scheduled_tokens={r: 1 for r in ids})
        got.append(harness.run_step(step).get("dispatch").fields["num_active_loras"].values)
    assert got == [4, 2, 1]  # 3 adapters -> case 4, 2 -> 2, 1 -> 1
