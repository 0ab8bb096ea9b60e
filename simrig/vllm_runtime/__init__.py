"""The vLLM this process runs: chosen, loaded and, for the self-test, edited.

``platform.py`` (CPU interpreter or CUDA, applied before vLLM is imported;
in CPU mode it installs ``triton_interpreter``, where the kernels run, through
``interpreter_patches.py``: the patch registry, memcheck when asked, the
start-up check on a Triton the patches do not know),
``overlay.py`` (a vLLM commit's MRV2 sources laid over an installed release,
``python -m simrig.vllm_runtime.overlay``) and ``mutate.py`` (seeded
regressions of the installed vLLM, in memory). One of the four rooms that may
import ``vllm`` (with ``vllm_api``, ``vllm_parts`` and ``adapters``); it may
import ``triton_interpreter``, ``triton_memcheck`` and the core (``trace_gate``), never the oracle, ``sources``, ``report``,
``campaign`` or ``selftest``.
"""
