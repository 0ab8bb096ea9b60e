"""Capture sizes and PCP options from vLLM's own config code (simrig.vllm_parts.vllm_config).

Expected sizes are written by hand from the rule VllmConfig._set_cudagraph_sizes
documents: with no sizes named, ``max = min(max_num_seqs * decode_query_len * 2,
512)`` capped by max_num_batched_tokens; ``[1, 2, 4] + range(8, 256, 8) +
range(256, max + 1, 16)``; max_num_batched_tokens appended when it fits; with
drafts, "Uniform decode sizes are appended" (request counts 1, 2, 4, 8, ...
times decode_query_len, within max). Named sizes "override this default logic".
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step

pytestmark = pytest.mark.vllm


def _sizes(**kwargs) -> tuple[int, ...]:
    from simrig.vllm_parts.vllm_config import capture_sizes_for

    return capture_sizes_for(RunnerConfig(**kwargs))


def test_default_sizes_follow_the_documented_pattern(vllm_api):
    # max = min(8 * 1 * 2, 512) = 16
    assert _sizes(max_num_reqs=8, cudagraph_mode="FULL_AND_PIECEWISE") == (1, 2, 4, 8, 16)
    # max = min(160 * 2, 512) = 320: steps of 8 below 256, then of 16
    assert _sizes(max_num_reqs=160, cudagraph_mode="PIECEWISE") == (
        1, 2, 4, *range(8, 256, 8), 256, 272, 288, 304, 320)
    # max = min(16 * 2, 512) = 32, capped by the 20-token budget, which is appended
    assert _sizes(max_num_reqs=16, max_num_batched_tokens=20,
                  cudagraph_mode="PIECEWISE") == (1, 2, 4, 8, 16, 20)
    assert _sizes(max_num_reqs=8, cudagraph_mode="NONE") == ()


def test_each_release_applies_its_own_rule(vllm_api):
    # max = min(12 * 2, 512) = 24; from 0.31 max_num_seqs itself, 12, is appended too
    # (a decode batch of every request: "Uniform decode sizes are appended"); 0.30
    # appends decode sizes only with drafts
    from packaging.version import Version

    twelve = Version(vllm_api.version).release >= (0, 31)
    assert _sizes(max_num_reqs=12, max_num_batched_tokens=64, cudagraph_mode="PIECEWISE") == (
        (1, 2, 4, 8, 12, 16, 24) if twelve else (1, 2, 4, 8, 16, 24))


def test_spec_decode_adds_whole_request_decode_sizes(vllm_api):
    # decode_query_len 3: max = min(4 * 3 * 2, 512) = 24; decode sizes 1, 2, 4 requests x 3
    assert _sizes(max_num_reqs=4, max_num_batched_tokens=64, num_speculative_tokens=2,
                  cudagraph_mode="FULL_DECODE_ONLY") == (1, 2, 3, 4, 6, 8, 12, 16, 24)


def test_named_sizes_override_the_default(vllm_api):
    from simrig.vllm_parts.vllm_config import vllm_config_for

    config = RunnerConfig(cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(7, 3, 5))
    compilation = vllm_config_for(config).compilation_config
    assert compilation.cudagraph_capture_sizes == [3, 5, 7]
    assert compilation.max_cudagraph_capture_size == 7
    assert compilation.cudagraph_mode.name == "FULL_AND_PIECEWISE"


def test_configs_are_cached_per_key_and_build_the_managers_config(vllm_api):
    from simrig.vllm_parts.cudagraph import dispatcher_for
    from simrig.vllm_parts.vllm_config import vllm_config_for

    config = RunnerConfig(max_num_reqs=8, cudagraph_mode="PIECEWISE")
    assert vllm_config_for(config) is vllm_config_for(dataclasses.replace(config, block_size=32))
    assert vllm_config_for(config) is not vllm_config_for(dataclasses.replace(config, max_num_reqs=9))
    manager = dispatcher_for(config)
    assert manager.compilation_config is vllm_config_for(config).compilation_config
    assert (manager.max_num_reqs, manager.cudagraph_mode.name) == (8, "PIECEWISE")


def test_pcp_options_are_read_off_the_parallel_config(vllm_api):
    from types import SimpleNamespace

    from simrig.vllm_api import versions

    parallel = SimpleNamespace(enable_expert_parallel=True, cp_kv_cache_interleave_size=4)
    kwargs = versions.pcp_kwargs(vllm_api.shape, False, vllm_api.PCPManager, parallel)
    assert kwargs["cp_interleave"] == 4
    if vllm_api.shape.pcp_shard_decode:  # 0.32+: the trace's own setting
        assert kwargs["shard_decode_requests"] is False
    if "moe_gathers_tokens" in kwargs:  # 0.33: all-gather only without expert parallelism
        assert kwargs["moe_gathers_tokens"] is False


def _prefill_of(tokens: int) -> Step:
    return Step(new_requests=[NewRequest("a", tokens)], num_scheduled_tokens={"a": tokens})


def test_the_oracle_judges_padding_by_the_sizes_the_runner_used(vllm_api):
    """vLLM appends the 20-token budget to the sizes (simrig's old pattern stopped at 16):
    an 18-token prefill replays the 20-token PIECEWISE graph, and the oracle, reading the
    recorded sizes, accepts it; told the runner had no 20-token graph, it objects."""
    from simrig.checks.checker import Checker
    from simrig.harness import Harness

    config = RunnerConfig(max_num_reqs=16, max_num_batched_tokens=20, max_model_len=64,
                          cudagraph_mode="PIECEWISE")
    harness = Harness(config)
    obs = harness.run_step(_prefill_of(18))
    dispatch = obs.get("dispatch").fields
    assert dispatch["capture_sizes"].values == [1, 2, 4, 8, 16, 20]
    assert (dispatch["cg_mode"].values, dispatch["num_tokens"].values) == ("PIECEWISE", 20)
    assert [f for f in Checker(config).check(0, _prefill_of(18), obs) if not f.known] == []

    dispatch["capture_sizes"] = dataclasses.replace(dispatch["capture_sizes"], values=[1, 2, 4, 8, 16])
    found = [f for f in Checker(config).check(0, _prefill_of(18), obs) if not f.known]
    assert [(f.check, f.field) for f in found] == [("dispatch", "num_tokens")]


def test_capture_sizes_are_held_to_their_documented_properties():
    from simrig.graph_rules.padding import check_capture_sizes

    config = RunnerConfig(max_num_batched_tokens=32, cudagraph_mode="PIECEWISE")
    assert check_capture_sizes(0, config, [1, 2, 4, 32]) == []
    assert [f.field for f in check_capture_sizes(0, config, [4, 2])] == ["capture_sizes"]
    assert "outside the token budget" in check_capture_sizes(0, config, [1, 64])[0].message
    named = dataclasses.replace(config, capture_sizes=(4, 8))
    assert check_capture_sizes(0, named, [4, 8]) == []
    assert "other sizes than the trace names" in check_capture_sizes(0, named, [4, 8, 16])[0].message


def test_decodes_dispatch_against_the_derived_spec_decode_sizes(vllm_api):
    """With two drafts vLLM adds 3-token multiples: two 3-token decodes replay the
    FULL uniform graph of 6 tokens / 2 requests, and nothing is found."""
    from simrig.checks.checker import Checker
    from simrig.harness import Harness

    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128,
                          num_speculative_tokens=2, cudagraph_mode="FULL_DECODE_ONLY")
    steps = [Step(new_requests=[NewRequest("a", 5), NewRequest("b", 4)], num_scheduled_tokens={"a": 5, "b": 4}),
             Step(cached=[CachedUpdate("a", 5), CachedUpdate("b", 4)], num_scheduled_tokens={"a": 3, "b": 3},
                  spec_tokens={"a": 2, "b": 2})]
    harness, checker = Harness(config), Checker(config)
    found, observations = [], []
    for i, step in enumerate(steps):
        observations.append(harness.run_step(step))
        found += [f for f in checker.check(i, step, observations[-1]) if not f.known]
    assert found == []
    d = observations[1].get("dispatch").fields
    assert d["capture_sizes"].values == [1, 2, 3, 4, 6, 8, 12, 16, 24]
    assert tuple(d[k].values for k in ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count")) == (
        "FULL", 6, 2, 3)
    assert np.array_equal(observations[1].get("prepare").fields["num_scheduled_tokens"].values, [3, 3])


def test_a_config_vllm_refuses_is_one_line_naming_the_rule(vllm_api):
    from simrig.vllm_parts.vllm_config import vllm_config_for

    with pytest.raises(ValueError) as caught:
        vllm_config_for(RunnerConfig(max_num_reqs=8, max_num_batched_tokens=4))
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("config: vLLM's SchedulerConfig refuses it: max_num_batched_tokens (4)")
