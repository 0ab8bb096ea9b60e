"""The harness drives the real MRV2 functions and observes every stage."""

from __future__ import annotations

import numpy as np
import pytest

from simrig import observe as obs
from simrig.harness import Harness
from simrig.report.snapshot import scenario_steps
from simrig.step import NewRequest, RunnerConfig, Step, synth_token

pytestmark = pytest.mark.vllm


def _sequence() -> list[Step]:
    """Fresh prefill (c chunked), decodes, a spec-decode step with a rejection, decodes."""
    return scenario_steps()


@pytest.fixture(scope="module")
def spec_config() -> RunnerConfig:
    return RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256,
                        num_speculative_tokens=2)


def test_all_four_stages_observed(vllm_api, spec_config):
    harness = Harness(spec_config, api=vllm_api)
    results = [harness.run_step(step) for step in _sequence()]
    for result in results:
        assert result.errors == [], [s.error for s in result.errors]
        for stage in (obs.LIFECYCLE, obs.GATHER, obs.PREPARE, obs.DUMMY):
            assert result.get(stage) is not None, stage
            assert result.get(stage).duration_s > 0
    first = results[0].get(obs.PREPARE).fields
    # decode -> short extend -> prefill: c (4) before b (20) before a (40)
    assert first["req_ids"].values == ["c", "b", "a"]
    assert first["idx_mapping"].dtype == "int64"
    assert first["idx_mapping_np"].values.dtype == np.intp
    assert first["query_start_loc"].values.tolist() == [0, 4, 24, 64]
    # prompt tokens are synthesised deterministically
    assert first["input_ids"].values[:4].tolist() == [synth_token("c", p) for p in range(4)]


def test_spec_decode_step_and_positions(vllm_api, spec_config):
    harness = Harness(spec_config, api=vllm_api)
    results = [harness.run_step(step) for step in _sequence()]
    spec = results[2].get(obs.PREPARE).fields
    # draft-carrying requests lead the batch
    assert spec["req_ids"].values[:2] == ["a", "c"]
    assert spec["num_draft_tokens"].values == 4
    assert spec["positions"].values[:3].tolist() == [41, 42, 43]
    # a's 1 rejected draft leaves it at 43 computed tokens in the next step
    last = results[3].get(obs.PREPARE).fields
    order = last["req_ids"].values
    assert last["seq_lens"].values[order.index("a")] == 44


def test_never_added_id_is_captured_keyerror(vllm_api, spec_config):
    harness = Harness(spec_config, api=vllm_api)
    harness.run_step(_sequence()[0])
    result = harness.run_step(Step(num_scheduled_tokens={"ghost": 1}))
    gather = result.get(obs.GATHER)
    assert gather.error is not None
    assert gather.error.type == "KeyError"
    assert gather.error.req_ids == ("ghost",)
    assert result.index == 1
    assert result.get(obs.PREPARE) is None  # the runner stops where vLLM raised


@pytest.mark.parametrize("pcp_size", [2, 4])
def test_pcp_rank_local_batches(vllm_api, pcp_size):
    config = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=256, max_model_len=512,
                          pcp_size=pcp_size)
    harness = Harness(config, api=vllm_api)
    result = harness.run_step(Step(new_requests=[NewRequest("p", 64), NewRequest("q", 3)],
                                   num_scheduled_tokens={"p": 64, "q": 3}))
    assert result.errors == []
    locals_ = [result.get(obs.PARTITION, rank) for rank in range(pcp_size)]
    assert all(stage is not None for stage in locals_)
    local_tokens = [int(stage.fields["num_tokens"].values) for stage in locals_]
    # the 64-token prefill is split into 2P chunks, two per rank
    assert sum(local_tokens) >= 64
    for stage in locals_:
        assert stage.fields["idx_mapping"].dtype == "int64"
        assert stage.fields["pcp.global_num_tokens"].values == 67


def test_stage_selection_skips_prepare(vllm_api, spec_config):
    harness = Harness(spec_config, stages=[obs.GATHER, obs.DUMMY], api=vllm_api)
    result = harness.run_step(_sequence()[0])
    assert result.get(obs.GATHER) is not None and result.get(obs.DUMMY) is not None
    assert result.get(obs.PREPARE) is None


def test_unknown_stage_rejected(vllm_api, spec_config):
    with pytest.raises(ValueError, match="unknown stage"):
        Harness(spec_config, stages=["gather", "warp"], api=vllm_api)
