"""The version-aware adapter against the installed vLLM (any supported release).

What each release offers is written down here from vLLM's release notes and
signatures (/work/shared/VLLM_VERSIONS.md), not read from the adapter, so a
wrong detection fails. A source checkout newer than the table only has to be
detected without error.
"""

from __future__ import annotations

import dataclasses

import pytest

from simrig.adapters import runner as runner_mod
from simrig.adapters.runner import VllmApiError
from simrig.step import RunnerConfig
from simrig.vllm_api import versions

# release -> (prepare takes num_active_loras, partition takes batch_desc,
#             PCP decode sharding, SchedulerOutput fields simrig must fill)
EXPECTED = {
    "0.30.0": (False, False, False, {"num_common_prefix_blocks"}),
    "0.31.0": (True, True, False, {"num_common_prefix_blocks"}),
    "0.32.0": (True, True, True, set()),
    "0.33.0": (True, True, True, set()),
}

pytestmark = pytest.mark.vllm


def test_shape_matches_the_release(vllm_api):
    shape = vllm_api.shape
    if vllm_api.version not in EXPECTED:
        pytest.skip(f"vLLM {vllm_api.version} is newer than the table; detection alone passed")
    loras, desc, shard, fill = EXPECTED[vllm_api.version]
    assert shape.prepare_takes_num_active_loras is loras
    assert shape.partition_takes_batch_desc is desc
    assert shape.pcp_shard_decode is shard
    assert set(shape.fillers.get("SchedulerOutput", {})) == fill


def test_unavailable_stage_is_named_only_where_the_release_lacks_it(vllm_api):
    shard = RunnerConfig(pcp_size=4, shard_decode_requests=True)
    plain = RunnerConfig(pcp_size=2)
    assert vllm_api.unavailable(plain) == []
    missing = vllm_api.unavailable(shard)
    if vllm_api.shape.pcp_shard_decode:
        assert missing == [] and len(vllm_api.build_pcp_managers(shard)) == 4
    else:
        assert [(u.stage, u.capability) for u in missing] == [("partition", "pcp_shard_decode_requests")]
        assert "shard_decode_requests" in missing[0].reason and vllm_api.version in missing[0].reason
        assert vllm_api.build_pcp_managers(shard) == []  # the rest of the step still runs


def _detect(vllm_api, **override):
    kw = dict(runner_cls=vllm_api.GPUModelRunner, pcp_cls=vllm_api.PCPManager,
              request_state_cls=vllm_api.RequestState,
              scheduler_output_cls=vllm_api.SchedulerOutput,
              new_request_cls=vllm_api.NewRequestData,
              cached_request_cls=vllm_api.CachedRequestData)
    kw.update(override)
    return versions.detect_shape(vllm_api.version, **kw)


def test_an_unknown_required_constructor_parameter_is_one_line(vllm_api):
    real = vllm_api.PCPManager

    class DriftedPCPManager(real):  # a future release adds a required parameter
        def __init__(self, pcp_world_size, pcp_rank, device, max_num_reqs, max_num_tokens,
                     dcp_world_size, dcp_rank, new_required_knob):
            raise AssertionError("never constructed")

    with pytest.raises(VllmApiError) as err:
        _detect(vllm_api, pcp_cls=DriftedPCPManager)
    text = str(err.value)
    assert "\n" not in text
    assert err.value.module == "vllm.v1.worker.gpu.pcp_manager"
    assert err.value.attribute == "PCPManager"
    assert err.value.version == vllm_api.version
    assert "new_required_knob" in text and vllm_api.version in text


def test_an_unknown_required_scheduler_output_field_is_one_line(vllm_api):
    drifted = dataclasses.make_dataclass(  # a future release adds a required field
        "SchedulerOutput", [("brand_new_field", int, dataclasses.field(kw_only=True))],
        bases=(vllm_api.SchedulerOutput,))
    with pytest.raises(VllmApiError, match=r"SchedulerOutput\.brand_new_field") as err:
        _detect(vllm_api, scheduler_output_cls=drifted)
    assert err.value.module == "vllm.v1.core.sched.output"
    assert vllm_api.version in str(err.value)


def test_an_unknown_partition_call_shape_is_one_line(vllm_api):
    class Renamed(vllm_api.PCPManager):
        def partition_batch(self, input_batch, execution_plan):  # neither known shape
            raise AssertionError("never called")

    with pytest.raises(VllmApiError, match=r"PCPManager\.partition_batch.*neither"):
        _detect(vllm_api, pcp_cls=Renamed)


def test_doctor_names_module_attribute_and_version_on_drift(vllm_api, monkeypatch, capsys):
    from simrig.cli import main

    real = vllm_api.PCPManager

    class DriftedPCPManager(real):
        def __init__(self, pcp_world_size, pcp_rank, device, max_num_reqs, max_num_tokens,
                     dcp_world_size, dcp_rank, new_required_knob):
            raise AssertionError("never constructed")

    monkeypatch.setattr("vllm.v1.worker.gpu.pcp_manager.PCPManager", DriftedPCPManager)
    monkeypatch.setattr(runner_mod, "_api", None)  # the next load() reads the drifted class
    assert main(["doctor"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1
    assert "vllm.v1.worker.gpu.pcp_manager.PCPManager" in err[0]
    assert "new_required_knob" in err[0] and vllm_api.version in err[0]
