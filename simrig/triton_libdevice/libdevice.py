"""libdevice's math in Triton's interpreter, which has no answer for it.

``triton.language.extra.libdevice`` holds stubs (``def log1p(arg0): ...``) that the compiler
resolves to a device's math library; the interpreter runs the stub and gets ``None``. vLLM
0.30.0's Gumbel kernel draws ``-log(-log1p(-u))``, every release's rejection sampler scores a
residual with ``log1p(-ratio)``, ``compute_nans`` calls ``isnan``. Each entry below is numpy's
meaning ("log(1 + x), accurate also for x so small that 1 + x == 1"), applied to the
interpreter's numpy-backed tensor in the operand's own dtype. No kernel body is changed.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

# name -> (numpy's function, whether it is a predicate: int1 rather than the operand's type)
LIBDEVICE_MEANINGS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool]] = {
    "log1p": (np.log1p, False), "isnan": (np.isnan, True)}
LIBDEVICE_MODULE = "triton.language.extra.libdevice"
PROBE_VALUES = (-0.75, -1e-7, 0.0, 3e-10, 2.5, float("nan"))  # a tail log(1 + x) loses, and a nan


def _elementwise(name: str) -> Callable[..., Any]:
    fn, predicate = LIBDEVICE_MEANINGS[name]

    def call(arg0: Any, *_: Any, **__: Any) -> Any:
        import triton.language as tl  # lazy: triton loads only when a kernel runs
        from triton.runtime.interpreter import TensorHandle

        if not isinstance(arg0, tl.tensor):
            raise TypeError(f"libdevice.{name} in Triton's interpreter takes a tensor, got {type(arg0).__name__}")
        with np.errstate(invalid="ignore", divide="ignore"):  # a device warns of no log1p(-1)
            data = fn(arg0.handle.data)
        if not predicate:
            return tl.tensor(TensorHandle(data.astype(arg0.handle.data.dtype, copy=False), arg0.handle.dtype.scalar),
                             arg0.type)
        out_type = tl.block_type(tl.int1, list(arg0.type.shape)) if arg0.type.is_block() else tl.int1
        return tl.tensor(TensorHandle(data, tl.int1), out_type)

    call.__name__, call.simrig_libdevice = name, True  # type: ignore[attr-defined]
    return call


def answer_libdevice() -> bool:
    """Each function of ``LIBDEVICE_MEANINGS`` on Triton's libdevice module (what vLLM's
    ``tldevice`` and ``libdevice`` are). False: a Triton without them, left as is."""
    try:
        module = importlib.import_module(LIBDEVICE_MODULE)  # optional: triton
    except ImportError:
        return False
    if not all(callable(getattr(module, name, None)) for name in LIBDEVICE_MEANINGS):
        return False
    for name in LIBDEVICE_MEANINGS:
        setattr(module, name, _elementwise(name))
    return True


def called_in(source: str) -> set[str]:
    """The libdevice functions a kernel module's source calls (as ``tldevice.f`` or ``libdevice.f``)."""
    return set(re.findall(r"\b(?:tldevice|libdevice)\.(\w+)", source))


def answered() -> frozenset[str]:
    """The libdevice functions this process's interpreter answers (the patch installed)."""
    module = sys.modules.get(LIBDEVICE_MODULE)
    return frozenset(n for n in LIBDEVICE_MEANINGS if getattr(getattr(module, n, None), "simrig_libdevice", False))


_kernel: Any = None


def probe() -> list:
    """``log1p`` and ``isnan`` of ``PROBE_VALUES`` in float32. Without the patch Triton has no
    answer, so the one "before" is the meaning itself, numpy's; with it, a kernel's through
    the interpreter: the registry installs the patch only where they agree bit for bit."""
    global _kernel
    x = np.array(PROBE_VALUES, dtype=np.float32)
    if not answered():
        return [np.log1p(x).tobytes().hex(), np.isnan(x).tolist()]
    import torch  # lazy: torch and triton load only when this runs
    import triton
    import triton.language as tl

    if _kernel is None:  # made on first use: TRITON_INTERPRET=1 is set by then
        @triton.jit
        def libdevice_kernel(src, logs, nans, N: tl.constexpr):
            x = tl.load(src + tl.arange(0, N))
            tl.store(logs + tl.arange(0, N), tl.extra.libdevice.log1p(x))
            tl.store(nans + tl.arange(0, N), tl.extra.libdevice.isnan(x).to(tl.int8))

        _kernel = libdevice_kernel
    src = torch.zeros(8, dtype=torch.float32)
    src[: len(x)] = torch.from_numpy(x)
    logs, nans = torch.zeros(8, dtype=torch.float32), torch.zeros(8, dtype=torch.int8)
    _kernel[(1,)](src, logs, nans, N=8)
    return [logs[: len(x)].numpy().tobytes().hex(), [bool(v) for v in nans[: len(x)].tolist()]]
