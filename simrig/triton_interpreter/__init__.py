"""Triton's interpreter, where every MRV2 kernel runs on a CPU.

``interpreter.py`` runs the interpreter as a GPU runs a kernel; ``interpreter_speed.py``,
``interpreter_types.py`` and ``interpreter_launch.py`` do its plumbing with less overhead,
each patch returning what Triton's own code returns; ``registry.py`` installs each patch only
after its probe agrees with Triton on a known-good Triton, and ``patch_catalogue.py`` declares
them (docs/layout.md has the per-file table; docs/setup.md, "Triton's interpreter patches").
It may import Triton, torch, numpy and the core (``trace_gate``), never ``vllm`` or any
other room; ``vllm_runtime.platform`` installs it in CPU mode.
"""
