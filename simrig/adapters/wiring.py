"""Equip a model-less GPUModelRunner so that its own ``execute_model`` runs.

The runner is created with ``__new__`` (its ``__init__`` needs CUDA streams,
process groups and a model) and given the attributes ``execute_model`` reads.
Everything on the input path is vLLM's own object: request state, input
buffers, ``BlockTables`` built from a KV cache config, the PCP manager, the
cudagraph manager, the no-op KV connector, the EPLB controller, the step
timer. Only collaborators that need a model or a GPU are stand-ins
(``simrig.adapters.standins``); the README lists each with its reason.

    execute_model reads             given
    ───────────────────             ─────
    block_tables, kv_cache_config   real BlockTables, one full-attention KV group
                                    (block_size from the trace config)
    pcp_manager                     PCP rank 0's real PCPManager (block tables set
                                    where the release has set_block_tables)
    cudagraph_manager               vLLM's CudaGraphManager (adapters/cudagraph.py);
                                    FULL replay is FullGraphReplay
    kv_connector, ec_connector      vLLM's no-op connectors
    eplb, step_timing               vLLM's EPLBController, StepTimingCollector
    vllm_config                     vLLM's default VllmConfig (set_forward_context)
    model, model_state              ModelStandIn, ModelStateStandIn
    lora_config, lora_state         vLLM's LoRAConfig (None when the trace has no
                                    LoRA) and LoraState (adapters/lora.py)
    lora_manager                    LoraManagerStandIn when LoRA is on
    sampler, prompt_logprobs_worker SamplerStandIn, PromptLogprobsStandIn (the
                                    harness samples the trace's tokens, then calls
                                    the real postprocess_sampled)
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace
from typing import Any

from simrig.adapters import lora, standins
from simrig.step import RunnerConfig

# Layer names of the one KV cache group (any names work: no layer reads them).
KV_LAYERS = ("model.layers.0.self_attn.attn",)


class SamplerStandIn:
    """Sampler bookkeeping: the harness picks the trace's tokens itself, so
    there is no sampling state to keep (no penalties: no output bin counts)."""

    penalties_state = SimpleNamespace(output_bin_counts=None)

    def add_request(self, *args: Any) -> None:
        pass

    def apply_staged_writes(self) -> None:
        pass


class PromptLogprobsStandIn:
    """Prompt logprobs need logits of a model; traces request none."""

    def add_request(self, *args: Any) -> None:
        pass

    def remove_request(self, req_id: str) -> None:
        pass


def kv_cache_config(config: RunnerConfig) -> Any:
    """One full-attention KV cache group with the trace's block size, enough
    blocks for every request at the longest model length."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    num_blocks = config.max_num_reqs * blocks_per_request(config) + 1
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(list(KV_LAYERS), spec)])


def blocks_per_request(config: RunnerConfig) -> int:
    return math.ceil(config.max_model_len / config.block_size)


def block_tables(config: RunnerConfig, device: Any, dcp_rank: int = 0) -> Any:
    """vLLM's BlockTables for the one KV group, with the keyword arguments the
    installed release takes (kernel block sizes before 0.32, DCP sharding from
    0.31)."""
    from vllm.v1.worker.gpu.block_table import BlockTables

    params = inspect.signature(BlockTables).parameters
    kwargs: dict[str, Any] = dict(
        block_sizes=[config.block_size], max_num_reqs=config.max_num_reqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_blocks_per_group=[blocks_per_request(config)], device=device,
        cp_size=config.dcp_size, cp_rank=dcp_rank, cp_interleave=1)
    if "kernel_block_sizes" in params:
        kwargs["kernel_block_sizes"] = [config.block_size]
    if "dcp_sharded" in params:
        kwargs["dcp_sharded"] = [config.dcp_size > 1]
    return BlockTables(**kwargs)


def equip(runner: Any, config: RunnerConfig, device: Any, dispatcher: Any,
          pcp_manager: Any | None, tables: Any | None = None) -> Any:
    """Give ``runner`` what its execute_model reads (see the module docstring)."""
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.kv_connector import NO_OP_KV_CONNECTOR

    vllm_config = VllmConfig()
    runner.vllm_config = vllm_config
    runner.parallel_config = vllm_config.parallel_config
    runner.observability_config = vllm_config.observability_config
    runner.lora_config = lora.lora_config(config)
    runner.is_encoder_decoder = False
    runner.is_first_pp_rank = True
    runner.is_last_pp_rank = True
    runner.uses_inputs_embeds = False
    runner.supports_mm_inputs = False
    runner.use_aux_hidden_state_outputs = False
    runner.intermediate_tensors = None
    runner.aux_output_connector = None
    runner.ubatch_runner = None
    runner.speculator = None
    runner.num_speculative_steps = config.num_speculative_tokens
    runner.max_model_len = config.max_model_len
    runner.max_num_tokens = config.max_num_batched_tokens
    for name, value in (("dp_size", 1), ("dp_rank", 0)):  # properties from 0.33
        if not isinstance(getattr(type(runner), name, None), property):
            setattr(runner, name, value)
    runner.dcp_size = config.dcp_size
    runner.use_dcp = config.dcp_size > 1
    runner.dcp_rank = 0
    runner.cp_interleave = 1
    runner.kv_connector = NO_OP_KV_CONNECTOR
    runner.ec_connector = _ec_connector(vllm_config)
    runner.eplb = _eplb(vllm_config, device)
    runner.step_timing = _step_timing()
    runner.kv_cache_config = kv_cache_config(config)
    runner.block_tables = tables if tables is not None else block_tables(config, device)
    runner.attn_groups = [[]]
    runner.model = standins.ModelStandIn(torch, device)
    runner.model_state = standins.ModelStateStandIn(config.max_model_len)
    runner.lora_state = lora.lora_state(config)
    runner.lora_manager = standins.LoraManagerStandIn() if runner.lora_config is not None else None
    runner.sampler = SamplerStandIn()
    runner.prompt_logprobs_worker = PromptLogprobsStandIn()
    runner.execute_model_state = None
    # Candidates are built; capture's forward context reads the full config.
    dispatcher.vllm_config = vllm_config
    dispatcher.device = device
    runner.cudagraph_manager = dispatcher
    runner.pcp_manager = pcp_manager
    if pcp_manager is not None and getattr(pcp_manager, "_block_tables", None) is None:
        pcp_manager.set_block_tables(runner.block_tables)  # 0.33: attached at KV init
    return runner


def _ec_connector(vllm_config: Any) -> Any:
    try:
        from vllm.v1.worker.gpu.ec_connector import get_ec_connector
    except ImportError:  # releases without an encoder-cache connector
        return None
    return get_ec_connector(vllm_config, None)


def _eplb(vllm_config: Any, device: Any) -> Any:
    try:
        from vllm.v1.worker.gpu.eplb_utils import EPLBController
    except ImportError:
        return None
    return EPLBController(vllm_config.parallel_config, device)


def _step_timing() -> Any:
    from vllm.v1.worker.gpu import model_runner

    collector = getattr(model_runner, "StepTimingCollector", None)
    return collector() if collector is not None else None
