"""Adapters: the model-less GPUModelRunner, built, equipped, observed and reused.

``runner.py`` (version detection, Step -> SchedulerOutput; ``VllmApi.build_parts``:
the runner and everything driven next to it), ``wiring.py`` (the one list
of what ``execute_model`` reads: ``equip`` sets every attribute of the
model-less runner), ``standins.py`` (model, model state, FULL replay),
``sampling.py`` (the sampler and drafter stand-ins), ``probes.py`` (observing
by wrapping, the capture tap, a descriptor's observed fields), ``pp_peer.py``
(the non-last PP rank driven next to the last one) and ``reuse.py`` (a runner's
state after start-up, kept and put back). One of the
four rooms that may import ``vllm`` (with ``vllm_runtime``, ``vllm_api`` and
``vllm_parts``, below it); it may import the core step model and
observations, never the oracle, ``sources``, ``trace_io``, ``report``,
``campaign``, ``selftest``, the harness or the replay loop.
"""
