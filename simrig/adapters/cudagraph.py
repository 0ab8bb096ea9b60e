"""vLLM's own cudagraph dispatch, without a GPU.

``CudaGraphManager`` (``vllm/v1/worker/gpu/cudagraph_utils.py``) decides, per
step, which captured graph a batch replays: its ``_init_candidates`` builds the
priority-ordered descriptor list per token count from the cudagraph mode and
capture sizes, and ``dispatch`` picks the first compatible descriptor (or an
eager one). Both are plain Python; only ``__init__`` touches the GPU world
(the distributed PP group, the platform's graph pool). So the manager is
created with ``__new__`` and given exactly the attributes those two methods
read; nothing is captured and no graph runs:

    stood in                            real
    ────────                            ────
    vllm_config: scheduler/compilation/  CudaGraphManager._init_candidates
      speculative/cache config values    CudaGraphManager.dispatch
    graphs marked captured               _is_compatible, BatchExecutionDescriptor

Status: the dispatcher is real and tested (tests/test_cudagraph_dispatch.py);
the harness still runs every step eager. Feeding its descriptors through
prepare_inputs / partition_batch needs a padding-aware reference model (padded
query_start_loc, seq_lens, idx_mapping, positions of padded rows) first.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def build_dispatcher(mode: str, capture_sizes: Sequence[int], *, max_num_reqs: int,
                     decode_query_len: int, num_speculative_tokens: int = 0,
                     varlen_decode: bool = False) -> Any:
    """A ``CudaGraphManager`` whose candidates are vLLM's own, ready to ``dispatch``."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    if mode not in MODES:
        raise ValueError(f"cudagraph mode: {mode!r}; choose from {', '.join(MODES)}")
    sizes = sorted({int(s) for s in capture_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"capture sizes: positive integers required, got {list(capture_sizes)}")
    manager = CudaGraphManager.__new__(CudaGraphManager)
    manager.vllm_config = SimpleNamespace(
        speculative_config=None, num_speculative_tokens=num_speculative_tokens,
        cache_config=SimpleNamespace(use_kda_recoverssm=False),
        parallel_config=SimpleNamespace(data_parallel_size=1))
    manager.compilation_config = SimpleNamespace(cudagraph_capture_sizes=sizes,
                                                 max_cudagraph_capture_size=sizes[-1])
    manager.max_num_reqs = max_num_reqs
    manager.cudagraph_mode = getattr(CUDAGraphMode, mode)
    manager.decode_query_len = decode_query_len
    manager.varlen_decode = varlen_decode
    manager.ubatch_runner = None
    manager.lora_capture_cases = [0]
    manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
    manager.graphs = {}
    manager._candidates = {}
    manager._capture_descs = {}
    manager._init_candidates()
    manager._graphs_captured = True  # dispatch as after capture
    return manager


def capture_descriptors(manager: Any) -> list[Any]:
    """Every descriptor the manager would capture (all modes), largest first."""
    return [d for descs in manager._capture_descs.values() for d in descs]
