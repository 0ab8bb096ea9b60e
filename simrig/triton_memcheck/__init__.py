"""A memory checker for kernels run in Triton's interpreter.

``memcheck.py`` (``--memcheck``, ``SIMRIG_MEMCHECK=1``) checks every load,
store and atomic of an interpreted kernel launch against the allocations of
its arguments before it happens, and narrow signed integer arithmetic against
overflow. It stands beside ``triton_interpreter`` on the same floor: it may
import Triton, torch and numpy, never ``vllm``, ``triton_interpreter`` or any
other room; ``vllm_runtime`` installs it through the interpreter's patch
registry when asked.
"""
