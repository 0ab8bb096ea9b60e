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


def test_a_step_without_idle_dummy_leaves_its_rows_for_the_next(vllm_api, spec_config):
    """idle_dummy=False skips the dummy after the step; the next, smaller step's prepare stage
    then sees the shared table's rows past its own (attn.filled_rows_past.0): empty on a
    release that clears them, and the observation is there either way."""
    big = Step(new_requests=[NewRequest("a", 4, block_ids=[1]), NewRequest("b", 4, block_ids=[2]),
                             NewRequest("c", 4, block_ids=[3])],
               num_scheduled_tokens={"a": 4, "b": 4, "c": 4}, idle_dummy=False)
    small = Step(finished=["b", "c"], num_scheduled_tokens={"a": 1})
    from simrig.step import CachedUpdate

    small.cached = [CachedUpdate("a", 4)]
    harness = Harness(spec_config, api=vllm_api)
    first, second = harness.run_step(big), harness.run_step(small)
    assert first.get(obs.DUMMY) is None and second.get(obs.DUMMY) is not None
    past = second.get(obs.PREPARE).fields["attn.filled_rows_past.0"].values
    assert past.dtype == np.int64 and past.ndim == 1
    # the rows b and c were gathered into (1 and 2) are past the one-request batch: 0.33.0
    # clears them, earlier releases keep both (known findings #40-#45)
    from simrig.findings.known import installed_vllm_version, release_tuple

    kept = release_tuple(installed_vllm_version()) < (0, 33, 0)
    assert past.tolist() == ([1, 2] if kept else [])
