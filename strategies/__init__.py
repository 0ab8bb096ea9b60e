"""Hypothesis strategies and the stateful scheduler-contract machine for simrig.

Importable by any test suite (vLLM's own included)::

    from hypothesis import given
    from strategies import scheduled_runs

    @given(scheduled_runs())
    def test_runner_accepts(run): ...
"""

from strategies.blocks import BlockPool
from strategies.configs import (
    CUDAGRAPH_MODES,
    CudagraphDescriptor,
    capture_size_lists,
    cudagraph_descriptors,
    kv_group_lists,
    runner_configs,
)
from strategies.machine import MODES, VIOLATIONS, MachineSettings, NewFinding, SchedulerContractMachine
from strategies.model import SchedulerModel
from strategies.requests import lora_ids, new_requests, prefix_cache_hits, prompt_lengths, request_ids
from strategies.sampling import request_sampling, sampling_specs
from strategies.steps import scheduled_runs, scheduler_step, scheduler_steps

__all__ = [
    "BlockPool", "CUDAGRAPH_MODES", "CudagraphDescriptor", "capture_size_lists", "MODES", "MachineSettings", "NewFinding",
    "SchedulerContractMachine", "SchedulerModel", "VIOLATIONS", "cudagraph_descriptors", "kv_group_lists",
    "lora_ids", "new_requests", "prefix_cache_hits", "prompt_lengths", "request_ids", "request_sampling",
    "runner_configs", "sampling_specs",
    "scheduled_runs", "scheduler_step", "scheduler_steps",
]
