"""LoRA on a model-less runner: vLLM's own LoRA config, capture cases and adapters.

A trace states LoRA without a model (``RunnerConfig.max_loras``, each new request's
adapter id). ``lora_config``, ``lora_state``, ``capture_cases`` and ``lora_request`` give
the runner vLLM's own objects; only the worker's LoRA model manager is a stand-in
(``LoraManagerStandIn`` in ``simrig/adapters/standins.py``).

See docs/cudagraph.md, 'LoRA on a model-less runner'.
"""

from __future__ import annotations

from typing import Any

from simrig.step import RunnerConfig


def lora_config(config: RunnerConfig) -> Any:
    """vLLM's LoRAConfig for the trace config, or None when LoRA is off."""
    if config.max_loras <= 0:
        return None
    from vllm.config.lora import LoRAConfig  # lazy: vllm loads after platform.configure() sets its env

    return LoRAConfig(max_loras=config.max_loras, specialize_active_lora=config.specialize_active_lora)


def lora_state(config: RunnerConfig) -> Any:
    """vLLM's per-request adapter bookkeeping (GPUModelRunner.__init__ builds the same)."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.lora_utils import LoraState

    return LoraState(max_num_reqs=config.max_num_reqs)


def capture_cases(config: RunnerConfig) -> list[int]:
    """The active-adapter counts vLLM captures graphs for: its own
    ``get_lora_capture_cases``, as GPUModelRunner.__init__ calls it."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.config import CompilationConfig
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

    compilation = CompilationConfig(cudagraph_specialize_lora=config.cudagraph_specialize_lora)
    return list(get_lora_capture_cases(lora_config(config), compilation))


def lora_request(lora_id: int | None) -> Any:
    """vLLM's LoRARequest for a trace's adapter id (None: the base model).
    LoRARequest compares by name, so the name is a function of the id."""
    if lora_id is None:
        return None
    from vllm.lora.request import LoRARequest  # lazy: vllm loads after platform.configure() sets its env

    return LoRARequest(lora_name=f"adapter-{lora_id}", lora_int_id=lora_id,
                       lora_path=f"/simrig/adapters/{lora_id}")
