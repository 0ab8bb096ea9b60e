"""One runner for many examples (simrig.runners): a reused runner is as clean as
a fresh one, and a runner that is not is never handed out again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simrig.harness import Harness
from simrig.runners import RunnerPool
from simrig.trace_io.trace import read_trace

pytestmark = pytest.mark.vllm

SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "samples"
# one trace per axis the runner keeps state for: drafts, PCP ranks, graphs and
# capture, several KV cache groups, LoRA, preemption, the sampler's per-slot tables
TRACES = ("spec_decode.jsonl", "pcp2.jsonl", "graphs_dcp2.jsonl", "two_kv_groups.jsonl",
          "lora_two_adapters.jsonl", "preempt_resume.jsonl", "sampling_penalties.jsonl")


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def observed(harness, steps) -> list:
    """Every stage's fields and errors, in order (timings left out; the dummy's
    and profile runs' request ids are random names vLLM makes up)."""
    out = []
    for step in steps:
        result = harness.run_step(step)
        for st in result.stages:
            fields = {name: (fo.kind, fo.dtype, fo.shape, _plain(fo.values))
                      for name, fo in sorted(st.fields.items())
                      if not (st.stage in ("dummy", "capture", "profile") and name.endswith("req_ids"))}
            out.append((result.index, st.stage, st.rank, st.dcp_rank,
                        None if st.error is None else (st.error.type, st.error.message), fields))
    return out


def kept_runner(name: str, api) -> tuple:
    """(pool, a harness whose state after start-up the pool keeps, the trace's steps)."""
    header, steps = read_trace(SAMPLES / name)
    pool = RunnerPool()
    pool.prefer_reuse(header.config, api=api)
    return pool, pool.acquire(header.config, api=api), steps


@pytest.mark.parametrize("name", TRACES)
def test_a_reused_runner_observes_exactly_what_a_fresh_one_does(name, vllm_api):
    pool, first, steps = kept_runner(name, vllm_api)
    fresh = observed(Harness(first.config, api=vllm_api), steps)
    observed(first, steps)  # leaves requests, drafts, buffers and tables behind
    assert pool.release(first), pool.last_dirty
    again = pool.acquire(first.config, api=vllm_api)
    assert again is first and pool.stats()["reused"] == 1
    assert observed(again, steps) == fresh


def test_a_reused_runner_holds_no_request_of_the_example_before(vllm_api):
    pool, harness, steps = kept_runner("preempt_resume.jsonl", vllm_api)
    harness.run_step(steps[0])
    held = dict(harness.runner.req_states.req_id_to_index)
    assert held, "the first step admits requests"
    assert pool.release(harness)
    assert dict(harness.runner.req_states.req_id_to_index) == {}
    assert harness.reset() == []  # and stays clean


def test_a_runner_that_does_not_reset_clean_is_dropped(vllm_api, monkeypatch):
    pool, harness, steps = kept_runner("spec_decode.jsonl", vllm_api)
    for step in steps[:3]:
        harness.run_step(step)
    # a restore that misses the request states: what a state the rig cannot reach would look like
    from simrig.adapters import reuse

    restore = reuse.RunnerState.restore

    def partial(self):
        live = dict(harness.runner.req_states.req_id_to_index)
        restore(self)
        harness.runner.req_states.req_id_to_index.update(live)

    monkeypatch.setattr(reuse.RunnerState, "restore", partial)
    assert not pool.release(harness)
    assert pool.stats() == {"built": 1, "reused": 0, "dropped": 1, "tainted": 0, "idle": 0}
    assert any("dict" in d for d in pool.last_dirty)
    assert pool.acquire(harness.config, api=vllm_api) is not harness  # a fresh build instead


def test_scribbled_buffers_are_put_back(vllm_api):
    _, harness, steps = kept_runner("chunked_prefill.jsonl", vllm_api)
    harness.run_step(steps[0])
    before = harness._startup_state
    harness.runner.input_buffers.input_ids.fill_(12345)
    harness.runner.req_states.free_indices.reverse()
    assert harness.reset() == []
    assert harness._startup_state is before
    assert int(harness.runner.input_buffers.input_ids.max()) != 12345


def test_a_stepless_runner_is_clean_as_built(vllm_api):
    pool, harness, _ = kept_runner("spec_decode.jsonl", vllm_api)
    assert pool.release(harness) and pool.acquire(harness.config, api=vllm_api) is harness


def test_the_first_build_of_a_config_keeps_no_state_the_second_does(vllm_api):
    header, steps = read_trace(SAMPLES / "spec_decode.jsonl")
    pool = RunnerPool()
    first = pool.acquire(header.config, api=vllm_api)
    first.run_step(steps[0])
    assert not pool.release(first) and pool.stats()["dropped"] == 0  # nothing kept: not dirty
    second = pool.acquire(header.config, api=vllm_api)
    assert second is not first
    second.run_step(steps[0])
    assert pool.release(second) and pool.acquire(header.config, api=vllm_api) is second


def test_capacity_bounds_the_idle_runners(vllm_api):
    pool = RunnerPool(capacity=1)
    configs = [read_trace(SAMPLES / n)[0].config for n in ("spec_decode.jsonl", "chunked_prefill.jsonl")]
    harnesses = [pool.acquire(c, api=vllm_api) for c in configs]
    for h in harnesses:
        assert pool.release(h)
    assert pool.stats()["idle"] == 1
    assert pool.acquire(configs[1], api=vllm_api) is harnesses[1]  # the least recently used went
    with pytest.raises(ValueError, match="capacity"):
        RunnerPool(capacity=-1)


def test_a_runner_built_before_memcheck_is_never_handed_to_a_checked_run(vllm_api):
    """memcheck knows a pointer table's tensors only from data_ptr() calls it saw: a
    runner kept from before it went in would show its block tables out of bounds."""
    from simrig.triton_memcheck import memcheck

    was_installed = memcheck.installed()
    if was_installed:
        memcheck.uninstall()
    try:
        pool, unchecked, steps = kept_runner("spec_decode.jsonl", vllm_api)
        assert pool.release(unchecked)
        assert memcheck.install()
        checked = pool.acquire(unchecked.config, api=vllm_api)
        assert checked is not unchecked and pool.stats()["reused"] == 0
        for step in steps:
            errors = [(st.stage, st.error.message) for st in checked.run_step(step).stages if st.error]
            assert errors == []
    finally:
        memcheck.uninstall()
        if was_installed:
            memcheck.install()
