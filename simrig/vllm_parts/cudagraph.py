"""vLLM's own cudagraph dispatch, without a GPU.

``build_dispatcher`` and ``dispatcher_for`` build vLLM's own ``ModelCudaGraphManager``
as ``GPUModelRunner.initialize_kv_cache`` does, from the ``VllmConfig`` vLLM makes of
the trace config (``simrig.vllm_parts.vllm_config``); its candidate lists and
``dispatch`` are vLLM's, only the pipeline group and graph pool are stood in and
nothing is captured on a device. ``describe`` turns a descriptor into what the oracle
reads.

See docs/cudagraph.md, 'vLLM's dispatcher without a GPU'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from simrig.step import CUDAGRAPH_MODES, RunnerConfig
from simrig.vllm_parts import lora
from simrig.vllm_parts.vllm_config import vllm_config_for
from simrig.vllm_runtime import platform

MODES = CUDAGRAPH_MODES


def build_dispatcher(mode: str, capture_sizes: Sequence[int], *, max_num_reqs: int,
                     decode_query_len: int, num_speculative_tokens: int = 0,
                     varlen_decode: bool = False, max_num_batched_tokens: int | None = None) -> Any:
    """A ``CudaGraphManager`` for explicit capture sizes, ready to ``dispatch``
    (the token budget defaults to RunnerConfig's, raised to the largest size)."""
    if mode not in MODES:
        raise ValueError(f"cudagraph mode: {mode!r}; choose from {', '.join(MODES)}")
    sizes = sorted({int(s) for s in capture_sizes})
    if mode != "NONE" and (not sizes or sizes[0] < 1):
        raise ValueError(f"capture sizes: positive integers required, got {list(capture_sizes)}")
    if decode_query_len != 1 + num_speculative_tokens:
        raise ValueError(f"decode_query_len: {decode_query_len} must be 1 + num_speculative_tokens "
                         f"({num_speculative_tokens})")
    base = RunnerConfig()
    budget = max_num_batched_tokens or max(base.max_num_batched_tokens, *sizes, max_num_reqs)
    config = replace(base, max_num_reqs=max_num_reqs, max_num_batched_tokens=budget,
                     num_speculative_tokens=num_speculative_tokens, cudagraph_mode=mode,
                     capture_sizes=tuple(sizes), varlen_decode=varlen_decode)
    config.validate()
    return dispatcher_for(config)


def dispatcher_for(config: RunnerConfig) -> Any:
    """vLLM's manager for a runner config, built by its own ``__init__`` from
    the config's VllmConfig (eager configs get one too: it dispatches every
    batch to a NONE descriptor, as vLLM does)."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager


    vllm_config = vllm_config_for(config)
    with platform.graph_manager_without_process_groups():
        manager = ModelCudaGraphManager(
            vllm_config, None, vllm_config.compilation_config.cudagraph_mode,
            decode_query_len=config.decode_query_len, varlen_decode=config.varlen_decode)
    # LoRA capture cases are set after construction; the candidates follow them
    manager.lora_capture_cases = list(lora.capture_cases(config))  # vLLM's own (vllm_parts/lora.py)
    manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
    manager._candidates, manager._capture_descs = {}, {}
    manager._init_candidates()
    manager._graphs_captured = True  # dispatch as after capture (the harness captures first)
    return manager


def capture_sizes(manager: Any) -> list[int]:
    """The capture sizes the manager dispatches against (its compilation config's)."""
    return [int(s) for s in manager.compilation_config.cudagraph_capture_sizes]


def capture_descriptors(manager: Any) -> list[Any]:
    """Every descriptor the manager would capture (all modes), largest first."""
    return [d for descs in manager._capture_descs.values() for d in descs]


def dispatch(manager: Any, *, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
             max_query_len: int | None, decode_query_len: int) -> Any:
    """The descriptor ``execute_model`` would run this batch with, through
    vLLM's ``dispatch_cg_and_sync_dp`` (one DP rank, no LoRA, no ubatching;
    its parameters are checked with the other entry points)."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    desc, _ = dispatch_cg_and_sync_dp(
        manager, num_reqs, num_tokens, uniform_token_count, 1, 0, max_query_len=max_query_len,
        need_eager=False, num_active_loras=0, allow_ubatching=False,
        uniform_decode=uniform_token_count == decode_query_len)
    return desc


def mode_name(desc: Any) -> str:
    """The descriptor's runtime mode by name: NONE, PIECEWISE or FULL."""
    return getattr(desc.cg_mode, "name", str(desc.cg_mode))


def describe(desc: Any) -> dict[str, Any]:
    """A descriptor as plain observable values (the mode by name)."""
    return {"cg_mode": mode_name(desc), "num_tokens": int(desc.num_tokens),
            "num_reqs": None if desc.num_reqs is None else int(desc.num_reqs),
            "uniform_token_count": desc.uniform_token_count, "max_query_len": desc.max_query_len,
            # the captured LoRA case the batch runs under (a field from 0.30.0 on)
            **({"num_active_loras": int(desc.num_active_loras)}
               if hasattr(desc, "num_active_loras") else {})}
