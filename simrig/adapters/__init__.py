"""Adapters: the only code in simrig that imports ``vllm``.

Platform setup (CPU interpreter or CUDA, applied before vLLM is imported),
the runner adapter (version detection, entry-point checks, Step ->
SchedulerOutput, the model-less GPUModelRunner equipped for its own
execute_model, its stand-ins, the probes that observe it by wrapping, the
sampler and drafter stand-ins), the scheduler adapter (the
real v1 Scheduler, offline) and the in-memory mutation engine used by the
self-test. Differences between vLLM releases are handled here and nowhere
else. Adapters may import the core step model; never ``checks``, ``report``,
``campaign`` or ``selftest``.
"""
