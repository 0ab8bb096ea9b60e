"""Equip a model-less GPUModelRunner so that its own ``execute_model`` runs.

The runner is created with ``__new__`` and ``equip`` gives it every attribute
``execute_model`` reads: vLLM's own objects on the input path (``block_tables``,
``kv_cache_config``), stand-ins (``simrig/adapters/standins.py``) only for what needs a
model or a GPU. What ``GPUModelRunner.__init__`` sets and equip does not is listed in
``NOT_NEEDED`` with its reason; ``tests/test_equip_attributes.py`` holds both to each
release's source.

See docs/standins.md, 'What execute_model reads, and what equip gives it'.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

from simrig.adapters import sampling, standins
from simrig.step import SYNTH_VOCAB_SIZE, RunnerConfig
from simrig.vllm_parts import lora
from simrig.vllm_runtime import platform
from simrig.vllm_sampling import bitmask, switch


def layer_names(group: int) -> list[str]:
    """Layer names of KV cache group ``group`` (any names work: no layer reads them)."""
    return [f"model.layers.{group}.self_attn.attn"]


def kv_cache_config(config: RunnerConfig) -> Any:
    """One KV cache group per ``config.kv_groups`` entry (FullAttentionSpec or
    SlidingWindowSpec with its block size), enough blocks for every request at
    the longest model length in every group (``RunnerConfig.num_kv_blocks``)."""
    # lazy: vllm and torch load after platform.configure() sets the env
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    groups = []
    for index, group in enumerate(config.kv_groups):
        common = {"block_size": config.group_block_size(index), "num_kv_heads": 1, "head_size": 8,
                  "dtype": torch.float32}
        spec = (SlidingWindowSpec(sliding_window=group.window, **common)
                if group.kind == "sliding_window" else FullAttentionSpec(**common))
        groups.append(KVCacheGroupSpec(layer_names(index), spec))
    return KVCacheConfig(num_blocks=config.num_kv_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def blocks_per_request(config: RunnerConfig, group: int = 0) -> int:
    """Block-table row width of ``group``: every position up to max_model_len
    (a sliding-window row keeps the null entries of the blocks it skipped);
    ``RunnerConfig.blocks_per_request``, which the trace reader's bounds share."""
    return config.blocks_per_request(group)


def block_tables(config: RunnerConfig, device: Any, dcp_rank: int = 0) -> Any:
    """vLLM's BlockTables for the KV groups, with the keyword arguments the
    installed release takes (kernel block sizes before 0.32, DCP sharding from
    0.31, a sliding-window group's reach from 0.33)."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.block_table import BlockTables

    params = inspect.signature(BlockTables).parameters
    groups = range(config.num_kv_groups)
    sizes = [config.group_block_size(g) for g in groups]
    kwargs: dict[str, Any] = dict(
        block_sizes=sizes, max_num_reqs=config.max_num_reqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_blocks_per_group=[blocks_per_request(config, g) for g in groups], device=device,
        cp_size=config.dcp_size, cp_rank=dcp_rank, cp_interleave=1)
    if "kernel_block_sizes" in params:
        kwargs["kernel_block_sizes"] = list(sizes)
    if "dcp_sharded" in params:
        kwargs["dcp_sharded"] = [config.dcp_size > 1] * len(sizes)
    if "sliding_window_reach" in params:
        # as initialize_kv_cache computes it: the spec's num_retained_tokens for
        # a sliding-window group, 0 for full attention
        specs = [g.kv_cache_spec for g in kv_cache_config(config).kv_cache_groups]
        kwargs["sliding_window_reach"] = [getattr(spec, "num_retained_tokens", 0) for spec in specs]
    return BlockTables(**kwargs)


# What GPUModelRunner.__init__ sets (0.30.0-0.33.0) that equip does not, each with why the
# model-less runner needs none of it. Read only by __init__ itself and the start-up simrig
# replaces with equip (load_model, initialize_kv_cache, _init_kv_zero_meta,
# get_supported_tasks, update_config; the worker's graph-memory profiling and kernel warmup,
# functions handed the runner), unless the reason names the method and its guard.
# tests/test_equip_attributes.py compares this with the installed release's __init__.
NOT_NEEDED: dict[str, str] = {
    "cache_config": "read at start-up only: __init__ (the KV dtype), initialize_kv_cache, "
                    "the graph-memory profiling",
    "compilation_config": "read at start-up only; the cudagraph mode and sizes reach the "
                          "dispatcher through vllm_config (vllm_parts/cudagraph.py)",
    "dtype": "the model's dtype: read by __init__ only, to derive kv_cache_dtype",
    "kv_cache_dtype": "read by no method of the runner (the KV cache is built at start-up)",
    "is_pooling_model": "read at start-up only (load_model, get_supported_tasks, warmup); "
                        "no pooling runner",
    "jit_warmup_registry": "read by load_model and initialize_kv_cache only (kernel warmup)",
    "load_config": "read by load_model and update_config only: no model is loaded",
    "lora_capture_cases": "read by initialize_kv_cache only; vllm_parts/lora.py asks vLLM's "
                          "get_lora_capture_cases itself",
    "mm_registry": "`profile_run` reads it only under `self.supports_mm_inputs`, which equip "
                   "sets False (no multimodal encoder)",
    "scheduler_config": "read at start-up only: __init__ (max_num_tokens, max_num_reqs, set "
                        "here from the trace config), initialize_kv_cache, warmup",
    "speculative_config": "read at start-up only (__init__, load_model, warmup); equip sets "
                          "what they derive (num_speculative_steps, decode_query_len, the verifiers)",
}
# What equip sets that the installed release's __init__ may not, and no MRV2 code of that
# release reads: set for the releases that do read it (harmless elsewhere).
FOR_OTHER_RELEASES: dict[str, str] = {
    "routed_experts_capturer": "0.30.0's __init__ sets it and its execute_model reads it",
    "aux_output_connector": "0.31.0 on: __init__ sets it and execute_model reads it",
}


def equip(runner: Any, config: RunnerConfig, device: Any, dispatcher: Any,
          pcp_manager: Any | None, tables: Any | None = None, *, request_state: Any,
          input_buffers: Any) -> Any:
    """Give ``runner`` what its execute_model reads (docs/standins.md, 'What
    execute_model reads, and what equip gives it'):
    every attribute the runner has is set here. ``request_state`` and
    ``input_buffers`` are the installed release's RequestState and InputBuffers
    classes, as the adapter resolved them."""
    # lazy: vllm and torch load after platform.configure() sets the env
    import torch
    from vllm.v1.worker.gpu.kv_connector import NO_OP_KV_CONNECTOR

    runner.device = device
    runner.max_num_reqs = config.max_num_reqs
    runner.decode_query_len = config.decode_query_len
    runner.use_pp = False
    runner.adaptive_verification = None
    runner.fast_prefill = None
    runner.pooling_runner = None
    runner.pp_handler = None
    runner.encoder_cache = None
    runner.kv_block_zeroer = None
    runner.routed_experts_capturer = None
    runner.lora_manager = None
    runner.vocab_size = SYNTH_VOCAB_SIZE
    runner.model_config = SimpleNamespace(rswa_window=None)
    runner.req_states = request_state(
        max_num_reqs=config.max_num_reqs,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_speculative_steps=config.num_speculative_tokens,
        vocab_size=SYNTH_VOCAB_SIZE,
        device=device,
    )
    runner.input_buffers = input_buffers(
        max_num_reqs=config.max_num_reqs,
        max_num_tokens=config.max_num_batched_tokens,
        device=device,
    )
    # the trace config as vLLM's own VllmConfig (vllm_parts/vllm_config.py), the
    # one the dispatcher was built from: the forward context reads it
    vllm_config = dispatcher.vllm_config
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
    runner.attn_groups = [[] for _ in range(config.num_kv_groups)]
    runner.model = standins.ModelStandIn(torch, device, SYNTH_VOCAB_SIZE, runner)
    runner.model_state = standins.ModelStateStandIn(config.max_model_len, runner)
    runner.lora_state = lora.lora_state(config)
    runner.lora_manager = standins.LoraManagerStandIn() if runner.lora_config is not None else None
    _equip_sampling(runner, config, device)
    runner.execute_model_state = None
    # The dispatcher keeps the VllmConfig it was built from (vllm_parts/vllm_config.py).
    dispatcher.device = device
    runner.cudagraph_manager = dispatcher
    runner.pcp_manager = pcp_manager
    if pcp_manager is not None and getattr(pcp_manager, "_block_tables", None) is None:
        pcp_manager.set_block_tables(runner.block_tables)  # 0.33: attached at KV init
    return runner


def _equip_sampling(runner: Any, config: RunnerConfig, device: Any) -> None:
    """What sample_tokens reads: vLLM builds a rejection sampler and a
    speculator only with speculative decoding."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker
    from vllm.v1.worker.gpu.spec_decode.utils import DraftTokensHandler

    spec = config.num_speculative_tokens > 0
    runner.sampler = sampling.GreedySampler(runner)
    runner.rejection_sampler = sampling.GreedyVerifier(runner, config.decode_query_len) if spec else None
    if spec and config.rejection_sampler:
        runner.sampler, runner.rejection_sampler = sampling.vllm_samplers(runner, config.rejection_sampler)
    elif not spec and switch.sampler_runs_here():
        runner.sampler = switch.SamplerSwitch(switch.build_sampler(runner), runner.sampler)
    runner.speculator = sampling.DrafterStandIn(runner) if spec else None
    runner.batch_sharder = None
    runner.structured_outputs_worker = bitmask.structured_outputs_worker(runner, device)
    runner.check_ep_fault = False
    runner._draft_workspace_lane = 0  # vLLM's lane 1 is for DSpark drafters only
    kwargs = {"device": device} if "device" in inspect.signature(PromptLogprobsWorker).parameters else {}
    runner.prompt_logprobs_worker = PromptLogprobsWorker(config.max_num_reqs, **kwargs)
    with platform.streams_without_cuda():
        runner.draft_tokens_handler = DraftTokensHandler(device)
    if platform.current() is not None and platform.current().is_cpu:
        runner.__dict__["main_stream"] = platform.StreamStandIn()  # a cached_property
        runner.output_copy_stream = platform.StreamStandIn()
    else:
        import torch  # lazy: torch loads only when this runs

        runner.output_copy_stream = torch.cuda.Stream(device)


def _ec_connector(vllm_config: Any) -> Any:
    try:
        # optional: absent in older vLLM releases
        from vllm.v1.worker.gpu.ec_connector import get_ec_connector
    except ImportError:  # releases without an encoder-cache connector
        return None
    return get_ec_connector(vllm_config, None)


def _eplb(vllm_config: Any, device: Any) -> Any:
    try:
        from vllm.v1.worker.gpu.eplb_utils import EPLBController  # optional: absent in older vLLM releases
    except ImportError:
        return None
    return EPLBController(vllm_config.parallel_config, device)


def _step_timing() -> Any:
    from vllm.v1.worker.gpu import model_runner  # lazy: vllm loads after platform.configure() sets its env

    collector = getattr(model_runner, "StepTimingCollector", None)
    return collector() if collector is not None else None
