"""vLLM's own parts made from a trace's RunnerConfig, without a runner.

``vllm_config.py`` (vLLM's own ``VllmConfig``: where capture sizes and PCP
options come from), ``cudagraph.py`` (vLLM's own ``CudaGraphManager``
dispatch, built without a GPU), ``lora.py`` (vLLM's LoRA config, capture
cases and adapters) and ``scheduler.py`` (the real v1 ``Scheduler``, offline,
for the recorders). One of the four rooms that may import ``vllm``; it may
import the core step model and ``vllm_runtime`` (the platform), never the
oracle, ``sources``, ``report``, ``campaign`` or ``selftest``.
"""
