"""Triton's interpreter, where every MRV2 kernel runs on a CPU.

``interpreter.py`` (the interpreter run as a GPU runs a kernel: the language
patched once, dead overflow checks skipped, launches routed past the coverage
sampler), and the plumbing that does the interpreter's work with less
overhead, each patch returning what Triton's own code returns:
``interpreter_speed.py`` (per-op and per-launch plumbing),
``interpreter_types.py`` (block types kept, tensors built from kept
attributes, binary-op typing answered where it hands the operands back) and
``interpreter_launch.py`` (CPU tensors handed to a launch in place, argument
types kept, the lean splat of a scalar operand). ``registry.py`` installs each
patch only after its probe agrees with Triton's own answer, on a Triton it is
known good on, and records its state (``patch_states``); ``catalogue.py``
declares every patch: its target, its probe, its known-good Triton versions.
It may import Triton, torch, numpy and the core (``trace_gate``), never
``vllm`` or any other room; ``vllm_runtime.platform`` installs it in CPU mode.
"""
