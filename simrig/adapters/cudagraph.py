"""vLLM's own cudagraph dispatch, without a GPU.

``CudaGraphManager`` (``vllm/v1/worker/gpu/cudagraph_utils.py``) decides, per
step, which captured graph a batch replays: its ``_init_candidates`` builds the
priority-ordered descriptor list per token count from the cudagraph mode and
capture sizes, and ``dispatch`` picks the first compatible descriptor (or an
eager one). ``dp_utils.dispatch_cg_and_sync_dp`` is what
``GPUModelRunner.execute_model`` calls around it; with one DP rank it is the
manager's dispatch and nothing else. All of that is plain Python; only the
manager's ``__init__`` touches the GPU world (the distributed PP group, the
platform's graph pool). So the manager is created with ``__new__`` and given
exactly the attributes those methods read; nothing is captured and no graph
runs:

    stood in                              real
    ────────                              ────
    vllm_config: compilation/speculative/ CudaGraphManager._init_candidates
      cache/parallel config values        CudaGraphManager.dispatch
    graphs marked captured                _is_compatible, BatchExecutionDescriptor
    (no ubatching; LoRA capture cases     dp_utils.dispatch_cg_and_sync_dp (DP 1)
    from get_lora_capture_cases)

The harness then hands the chosen descriptor to the real ``prepare_inputs``,
``PCPManager.partition_batch`` and ``InputBatch.make_dummy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from simrig.adapters import lora
from simrig.step import CUDAGRAPH_MODES, RunnerConfig

MODES = CUDAGRAPH_MODES


def build_dispatcher(mode: str, capture_sizes: Sequence[int], *, max_num_reqs: int,
                     decode_query_len: int, num_speculative_tokens: int = 0,
                     varlen_decode: bool = False, lora_capture_cases: Sequence[int] = (0,)) -> Any:
    """A ``CudaGraphManager`` whose candidates are vLLM's own, ready to ``dispatch``."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    if mode not in MODES:
        raise ValueError(f"cudagraph mode: {mode!r}; choose from {', '.join(MODES)}")
    sizes = sorted({int(s) for s in capture_sizes})
    if mode != "NONE" and (not sizes or sizes[0] < 1):
        raise ValueError(f"capture sizes: positive integers required, got {list(capture_sizes)}")
    manager = ModelCudaGraphManager.__new__(ModelCudaGraphManager)
    manager.vllm_config = SimpleNamespace(
        speculative_config=None, num_speculative_tokens=num_speculative_tokens,
        cache_config=SimpleNamespace(use_kda_recoverssm=False),
        parallel_config=SimpleNamespace(data_parallel_size=1))
    manager.compilation_config = SimpleNamespace(cudagraph_capture_sizes=sizes,
                                                 max_cudagraph_capture_size=sizes[-1] if sizes else 0)
    manager.max_num_reqs = max_num_reqs
    manager.cudagraph_mode = getattr(CUDAGraphMode, mode)
    manager.decode_query_len = decode_query_len
    manager.varlen_decode = varlen_decode
    manager.ubatch_runner = None
    manager.lora_capture_cases = list(lora_capture_cases)  # vLLM's own (adapters/lora.py)
    manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
    manager.graphs = {}
    manager._candidates = {}
    manager._capture_descs = {}
    manager._init_candidates()
    # what capture (ModelCudaGraphManager.capture) reads and writes
    manager.device = None
    for name, value in (("dp_size", 1), ("tp_size", 1)):  # properties on some releases
        if not isinstance(getattr(type(manager), name, None), property):
            setattr(manager, name, value)
    manager.is_first_pp_rank = manager.is_last_pp_rank = True
    manager.pool = None
    manager._max_full_descs_to_capture = None
    manager._capture_mem_samples = None
    manager.use_breakable_cg = False
    manager.breakable_cg_runner = None
    manager.hidden_states = None
    manager.aux_hidden_states = []
    manager.use_aux_hidden_state_outputs = False
    manager.intermediate_tensors = None
    manager._graphs_captured = True  # dispatch as after capture (the harness captures first)
    return manager


def dispatcher_for(config: RunnerConfig) -> Any:
    """The manager for a runner config (eager configs get one too: it
    dispatches every batch to a NONE descriptor, as vLLM does)."""
    return build_dispatcher(config.cudagraph_mode, config.graph_capture_sizes,
                            max_num_reqs=config.max_num_reqs,
                            decode_query_len=config.decode_query_len,
                            num_speculative_tokens=config.num_speculative_tokens,
                            varlen_decode=config.varlen_decode,
                            lora_capture_cases=lora.capture_cases(config))


def capture_descriptors(manager: Any) -> list[Any]:
    """Every descriptor the manager would capture (all modes), largest first."""
    return [d for descs in manager._capture_descs.values() for d in descs]


def dispatch(manager: Any, *, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
             max_query_len: int | None, decode_query_len: int) -> Any:
    """The descriptor ``execute_model`` would run this batch with, through
    vLLM's ``dispatch_cg_and_sync_dp`` (one DP rank, no LoRA, no ubatching;
    its parameters are checked with the other entry points)."""
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
