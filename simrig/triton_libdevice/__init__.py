"""libdevice's math for kernels run in Triton's interpreter.

``libdevice.py`` gives the libdevice functions vLLM's kernels call (``log1p``, ``isnan``) their
numpy meanings where the interpreter has only the compiler's stubs. It stands beside
``triton_interpreter`` on the same floor: it may import Triton, torch and numpy, never
``vllm``, ``triton_interpreter`` or any other room; ``vllm_runtime`` installs it through the
interpreter's patch registry (``answer_libdevice``), as it does memcheck.
"""
