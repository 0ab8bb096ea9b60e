"""libdevice's math in Triton's interpreter: the functions vLLM's kernels call that the
interpreter has no answer for.

``triton.language.extra.libdevice`` holds stubs (``def log1p(arg0): ...``) that the compiler
resolves to a backend's device library. The interpreter compiles nothing: it runs the stub's
Python body and gets ``None``, so a kernel calling one fails on its first use of the result.
vLLM 0.30.0's Gumbel kernel draws its noise as ``-log(-log1p(-u))`` and every release's
rejection sampler scores a residual with ``log1p(-ratio)``; ``compute_nans`` calls ``isnan``.

Each entry of ``LIBDEVICE_MEANINGS`` is the function's meaning as numpy states it
(``np.log1p``: "log(1 + x), accurate also for x so small that 1 + x == 1"), applied to the
interpreter's numpy-backed tensor element by element in the operand's own dtype, as the
device function computes in it. No kernel body is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# name -> (numpy's function, whether the answer is a predicate: int1 rather than the operand's type)
LIBDEVICE_MEANINGS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool]] = {
    "log1p": (np.log1p, False),
    "isnan": (np.isnan, True),
}
LIBDEVICE_MODULE = "triton.language.extra.libdevice"
PROBE_VALUES = (-0.75, -1e-7, 0.0, 3e-10, 2.5, float("nan"))  # a tail log(1 + x) loses, and a nan


def _elementwise(name: str) -> Callable[[Any], Any]:
    fn, predicate = LIBDEVICE_MEANINGS[name]

    def call(arg0: Any, *unused: Any, **unused_kw: Any) -> Any:
        # lazy: triton loads only when a kernel runs
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        if not isinstance(arg0, tl.tensor):
            raise TypeError(f"libdevice.{name} in Triton's interpreter takes a tensor, got {type(arg0).__name__}")
        with np.errstate(invalid="ignore", divide="ignore"):  # a device gives no warning for log1p(-1)
            data = fn(arg0.handle.data)
        if not predicate:
            return tl.tensor(TensorHandle(data.astype(arg0.handle.data.dtype, copy=False), arg0.handle.dtype.scalar),
                             arg0.type)
        out_type = tl.block_type(tl.int1, list(arg0.type.shape)) if arg0.type.is_block() else tl.int1
        return tl.tensor(TensorHandle(data, tl.int1), out_type)

    call.__name__ = name
    call.__qualname__ = f"libdevice_{name}"
    call.__doc__ = f"libdevice.{name} in Triton's interpreter: numpy's {fn.__name__}, element by element."
    return call


def answer_libdevice() -> bool:
    """Give each function of ``LIBDEVICE_MEANINGS`` its numpy meaning on Triton's libdevice
    module (what vLLM's ``tldevice`` / ``libdevice`` names are). Returns whether it did
    (False: a Triton without this module, or whose functions are not stubs, left as is)."""
    try:
        import importlib

        module = importlib.import_module(LIBDEVICE_MODULE)  # optional: triton
    except ImportError:
        return False
    if not all(callable(getattr(module, name, None)) for name in LIBDEVICE_MEANINGS):
        return False
    for name in LIBDEVICE_MEANINGS:
        setattr(module, name, _elementwise(name))
    return True


def answered() -> frozenset[str]:
    """The libdevice functions this process's interpreter answers (the patch installed)."""
    import sys

    module = sys.modules.get(LIBDEVICE_MODULE)
    return frozenset(name for name in LIBDEVICE_MEANINGS
                     if getattr(getattr(module, name, None), "__qualname__", "") == f"libdevice_{name}")


_kernel: Any = None


def probe() -> list:
    """``log1p`` and ``isnan`` of ``PROBE_VALUES`` in float32, as float32 hex and bools.

    Without the patch the interpreter has no answer, so the answer "before" is the meaning
    itself, numpy's; with it, a kernel's through the interpreter. The registry installs the
    patch only where the two agree bit for bit."""
    global _kernel
    if not answered():
        x = np.array(PROBE_VALUES, dtype=np.float32)
        return [np.log1p(x).astype(np.float32).tobytes().hex(), np.isnan(x).tolist()]
    # lazy: torch and triton load only when this runs
    import torch
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice  # noqa: F401  (tl.extra.libdevice below)

    if _kernel is None:  # made on first use: TRITON_INTERPRET=1 is set by then
        @triton.jit
        def libdevice_kernel(src, logs, nans, N: tl.constexpr):
            offs = tl.arange(0, N)
            x = tl.load(src + offs)
            tl.store(logs + offs, tl.extra.libdevice.log1p(x))
            tl.store(nans + offs, tl.extra.libdevice.isnan(x).to(tl.int8))

        _kernel = libdevice_kernel
    n = 8
    src = torch.zeros(n, dtype=torch.float32)
    src[: len(PROBE_VALUES)] = torch.tensor(PROBE_VALUES, dtype=torch.float32)
    logs, nans = torch.zeros(n, dtype=torch.float32), torch.zeros(n, dtype=torch.int8)
    _kernel[(1,)](src, logs, nans, N=n)
    k = len(PROBE_VALUES)
    return [logs[:k].numpy().tobytes().hex(), [bool(v) for v in nans[:k].tolist()]]
