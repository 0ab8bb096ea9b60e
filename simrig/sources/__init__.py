"""Sources: where traces come from, before any vLLM runner code runs.

The recorder that drives vLLM's real scheduler with a workload
(``record.py``), the public-workload importers (``workloads.py``), the live
recorder (``live.py``, a vLLM general plugin) and the synthetic sampler that
closes the loop around the scheduler (``sampler.py``); they write trace files
through ``simrig.trace_io``. Modules here may import the core step model,
``sampling``, ``trace_io``, ``simrig.vllm_parts.scheduler`` and the sampling
mappings of ``simrig.vllm_sampling`` (only the recorder and the live recorder;
none imports vLLM before it runs); they never import ``vllm`` themselves, nor
``checks``, ``report``, ``campaign`` or ``selftest``.
"""
