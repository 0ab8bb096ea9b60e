"""Sources: where Steps come from, before any vLLM runner code runs.

The trace format (v1 JSON Lines) and its reader and writer, the recorder that
drives vLLM's real scheduler with a workload, the public-workload importers,
the live recorder (a vLLM general plugin) and the synthetic sampler that
closes the loop around the scheduler. Modules here may import the core step
model and ``simrig.adapters.scheduler`` (lazily, only the recorder and the
live recorder); they never import ``vllm`` themselves, nor ``checks``,
``report``, ``campaign`` or ``selftest``.
"""
