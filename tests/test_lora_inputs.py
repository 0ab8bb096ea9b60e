"""The LoRA mapping execute_model hands _set_active_loras, judged from the trace's adapters
(graph_rules/lora_inputs.py): per request, per token, the active set, and slot reuse."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pandas as pd
import pytest

from simrig.checks.checker import Checker
from simrig.graph_rules.lora_inputs import slot_reuses
from simrig.harness import Harness
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceHeader, TraceWriter
from tests import mutant_cli

CONFIG = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128, max_loras=2)


def reuse_steps() -> list[Step]:
    """a (adapter 1), b (adapter 2) and x (none) prefill; a finishes and c (none) takes
    its slot; b finishes and d (adapter 1) takes b's."""
    return [
        Step(new_requests=[NewRequest("a", 8, lora_id=1), NewRequest("b", 6, lora_id=2),
                           NewRequest("x", 5)],
             num_scheduled_tokens={"a": 8, "b": 6, "x": 5}),
        Step(cached=[CachedUpdate("b", 6), CachedUpdate("x", 5)], finished=["a"],
             num_scheduled_tokens={"b": 1, "x": 1}),
        Step(new_requests=[NewRequest("c", 7)], cached=[CachedUpdate("b", 7), CachedUpdate("x", 6)],
             num_scheduled_tokens={"b": 1, "c": 7, "x": 1}),
        Step(new_requests=[NewRequest("d", 3, lora_id=1)], finished=["b"],
             cached=[CachedUpdate("c", 7), CachedUpdate("x", 7)],
             num_scheduled_tokens={"c": 1, "d": 3, "x": 1}),
    ]


def _run(vllm_api, config: RunnerConfig):
    harness = Harness(config, api=vllm_api)
    steps = reuse_steps()
    return steps, [harness.run_step(s) for s in steps]


def _new(config, steps, observations):
    checker = Checker(config, trace="test")
    return [f for i, (s, o) in enumerate(zip(steps, observations)) for f in checker.check(i, s, o)
            if not f.known]


@pytest.mark.vllm
@pytest.mark.parametrize("pcp", [1, 2])
def test_slot_reuse_maps_every_token_to_its_own_adapter(vllm_api, pcp):
    config = dataclasses.replace(CONFIG, pcp_size=pcp)
    steps, observations = _run(vllm_api, config)
    assert [f.one_line() for f in _new(config, steps, observations)] == []
    stage = "partition" if pcp > 1 else "prepare"
    fields = observations[2].get(stage, 0 if pcp > 1 else None).fields
    rows = dict(zip(fields["req_ids"].values, fields["lora.prompt_mapping"].values))
    assert rows == {"b": 2, "c": 0, "x": 0}  # c took a's slot and runs no adapter
    assert fields["lora.active_ids"].values == [2]
    if pcp == 1:
        assert fields["lora.token_mapping"].values.count(0) == 8  # c's 7 tokens, x's 1


@pytest.mark.vllm
@pytest.mark.parametrize("name, change", [
    ("lora.prompt_mapping", lambda v: [*v[:-1], v[-1] + 1]),
    ("lora.token_mapping", lambda v: [*v[:-1], v[-1] + 1]),
    ("lora.token_mapping", lambda v: v[:-1]),  # a token without its entry
    ("lora.active_ids", lambda v: [*v, 7]),
])
def test_a_changed_mapping_is_a_finding(vllm_api, name, change):
    steps, observations = _run(vllm_api, CONFIG)
    record = observations[3].get("prepare")
    f = record.fields[name]
    record.fields[name] = dataclasses.replace(f, values=change(list(f.values)))
    found = {(f.step, f.stage, f.field, f.kind) for f in _new(CONFIG, steps, observations)}
    assert found == {(3, "prepare", name, "value_mismatch")}


@pytest.mark.vllm
def test_slot_reuse_is_recognised_from_the_trace_and_the_observed_slots(vllm_api):
    steps, observations = _run(vllm_api, CONFIG)
    held: dict[int, int] = {}
    adapter: dict[str, int] = {}
    seen = []
    for step, obs in zip(steps, observations):
        adapter.update({r.req_id: r.lora_id or 0 for r in step.new_requests})
        seen += [(r, before, mine) for r, _slot, before, mine in slot_reuses(step, obs, held, adapter)]
    assert seen == [("c", 1, 0), ("d", 2, 1)]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("mutant", ["-", "lora-stale-adapter-on-slot-reuse"])
def test_a_stale_adapter_after_slot_reuse_is_caught(tmp_path, mutant):
    trace = tmp_path / "lora.jsonl"
    with TraceWriter(str(trace), TraceHeader(config=CONFIG, source={"kind": "hand-written"})) as writer:
        for step in reuse_steps():
            writer.write(step)
    out = tmp_path / "out"
    proc = mutant_cli.run(["replay", str(trace), "--pcp-sizes", "1", "--no-coverage", "--out", str(out),
                           "--quiet"], None if mutant == "-" else mutant, timeout=400)
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    lora = classes[classes["field"].str.startswith("lora.")]
    if mutant == "-":
        assert proc.returncode == 0 and lora.empty, classes.to_string()
    else:
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert set(lora["field"]) == {"lora.prompt_mapping", "lora.token_mapping"}
        assert set(lora["verdict"]) == {"new"}


CONFTEST_MUTANT = """
from simrig.adapters.runner import load
from simrig.selftest.catalogue import BY_NAME
from simrig.vllm_runtime import mutate
load()
mutate.apply(BY_NAME["lora-stale-adapter-on-slot-reuse"])
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_repro_writes_a_standalone_file_that_fails_exactly_under_the_stale_adapter(tmp_path):
    """simrig repro states a lora_inputs class as a standalone pytest file (no simrig): it passes
    on the installed vLLM and fails with its message once the stale-adapter mutant is applied
    (a conftest next to the file applies it; the file itself does not know)."""
    from simrig.cli import main

    trace = tmp_path / "lora.jsonl"
    with TraceWriter(str(trace), TraceHeader(config=CONFIG, source={"kind": "hand-written"})) as writer:
        for step in reuse_steps():
            writer.write(step)
    outcomes = {}
    for name, conftest in (("clean", None), ("mutant", CONFTEST_MUTANT)):
        folder = tmp_path / name
        folder.mkdir()
        assert main(["repro", str(trace), "--class", "value_mismatch:prepare:lora.prompt_mapping",
                     "--pytest", str(folder / "test_lora.py")]) == 0
        assert not [line for line in (folder / "test_lora.py").read_text().splitlines()
                    if line.lstrip().startswith(("import simrig", "from simrig"))]
        if conftest:
            (folder / "conftest.py").write_text(conftest)
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-p", "no:simrig", "--rootdir", str(folder), str(folder)],
                              capture_output=True, text=True, cwd=folder, timeout=600)
        outcomes[name] = (proc.returncode, proc.stdout[-3000:])
    assert outcomes["clean"][0] == 0, outcomes["clean"][1]
    assert outcomes["mutant"][0] == 1, outcomes["mutant"][1]
    assert "_set_active_loras prompt_mapping [2, 0, 1]" in outcomes["mutant"][1]


@pytest.mark.vllm
def test_draft_tokens_map_to_their_requests_adapter(vllm_api):
    """A spec-decode step: a request's scheduled drafts are tokens of its own adapter."""
    config = dataclasses.replace(CONFIG, num_speculative_tokens=2)
    steps = [Step(new_requests=[NewRequest("a", 4, lora_id=2), NewRequest("b", 3)],
                  num_scheduled_tokens={"a": 4, "b": 3}),
             Step(cached=[CachedUpdate("a", 4), CachedUpdate("b", 3)],
                  num_scheduled_tokens={"a": 3, "b": 1}, spec_tokens={"a": 2})]
    harness = Harness(config, api=vllm_api)
    observations = [harness.run_step(s) for s in steps]
    assert [f.one_line() for f in _new(config, steps, observations)] == []
    fields = observations[1].get("prepare").fields
    by_request = dict(zip(fields["req_ids"].values, fields["lora.prompt_mapping"].values))
    assert by_request == {"a": 2, "b": 0}
    assert sorted(fields["lora.token_mapping"].values) == [0, 2, 2, 2]  # a's token and its 2 drafts
