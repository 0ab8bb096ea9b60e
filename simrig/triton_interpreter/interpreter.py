"""Triton's interpreter, run as a GPU runs a kernel compiled without debug.

This module skips the overflow checks ``device_assert`` drops anyway while debug is off
(``skip_dead_overflow_checks``), patches the language once, routes launches past the coverage
sampler, keeps numpy quiet about the 0/0 lanes a ``tl.where`` discards
(``quiet_discarded_nans``) and makes ``tl.range``'s variable a tensor (``range_yields_tensors``).
Platform plumbing only: no vLLM code and no kernel body is changed. See docs/setup.md,
"Triton's interpreter patches".
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any

from simrig import trace_gate as gate


def skip_dead_overflow_checks() -> bool:
    """Turn ``sanitize_overflow`` off in the interpreter's builder while its assertions are
    off. Returns whether it did (False: debug on, or a Triton without this layout, left as is).

    With it on (the interpreter's default), every integer ``+``, ``-`` and ``*`` narrower than
    64 bits is recomputed in int64, compared against the type's bounds and handed to
    ``device_assert``, which drops it unless ``options.debug`` is set: about a seventh of a
    campaign's wall time on CPU, for no observable effect. A kernel compiled without debug
    has no such check either; a user who turns debug on keeps both.
    """
    try:
        from triton.runtime import interpreter  # optional: triton
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


class _KeepPatched:
    """The scope ``GridExecutor`` restores after each launch: nothing to restore."""

    def restore(self) -> None:
        pass


def patch_language_once() -> bool:
    """Patch ``triton.language`` for the interpreter once, not around every launch. Returns
    whether it did (False: a Triton without this interpreter layout).

    Each launch's ``_patch_lang(fn)`` points every builtin of ``tl`` and ``tl.core`` (those
    the kernel's globals see) at its numpy semantics and restores them after: hundreds of
    ``setattr`` calls, the same each time. In CPU mode no kernel is compiled, so the patched
    language is the only one in use: applied once, for both modules, and kept.
    """
    try:
        # optional: triton
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "__simrig_once__", False):
        return False

    # _patch_lang reads only fn.__globals__: a stand-in that sees both modules
    fake = type("Kernel", (), {"__globals__": {"tl": tl, "core": tl.core}})()
    scope = original(fake)  # patched for good: restored only if the patch is taken back

    def patch_lang(fn: object) -> _KeepPatched:
        return _KeepPatched()

    patch_lang.__simrig_once__ = True  # type: ignore[attr-defined]
    patch_lang.__simrig_scope__ = scope  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_lang
    return True


def sample_traced_launches() -> bool:
    """Route every kernel launch through ``simrig.trace_gate.launch``, so a running coverage
    collector traces only the launches its sampler asks for (a plain call while none runs).
    Returns whether it was installed (False: a Triton without this layout, or already installed)."""
    try:
        from triton.runtime import interpreter  # optional: triton
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    original = getattr(executor, "__call__", None)
    if original is None or getattr(original, "__simrig_sampled__", False):
        return False

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if gate.ACTIVE is None:
            return original(self, *args, **kwargs)
        return gate.launch(_specialization(self, args, kwargs), lambda: original(self, *args, **kwargs))

    launch.__simrig_sampled__ = True  # type: ignore[attr-defined]
    executor.__call__ = launch
    return True


def _specialization(executor: Any, args: tuple, kwargs: dict) -> tuple:
    """A launch's kernel and its ``tl.constexpr`` values: what a compiled kernel is
    specialised on, so the branches they fix count apart."""
    names = executor.arg_names
    values = []
    for name in executor.constexprs:
        if name in kwargs:
            value = kwargs[name]
        else:
            at = names.index(name)
            value = args[at] if at < len(args) else None
        try:
            hash(value)
        except TypeError:
            value = repr(value)
        values.append(value)
    return (executor.fn, tuple(values))


_held: dict[int, tuple] = {}  # id(division result) -> (it, its new NaN lanes, kernel (file, line), registry)


def quiet_discarded_nans() -> bool:
    """Warn "invalid value encountered in divide" only for lanes a kernel keeps. Returns
    whether it was installed (False: a Triton without this layout, or already installed).

    numpy warns for each 0/0 (or inf/inf) an interpreted ``a / b`` computes, also in lanes a
    ``tl.where`` then discards, which a GPU computes and discards silently: vLLM's
    ``_rejection_kernel`` (block verification) runs ``tl.where(denom > 0.0, residual_mass /
    denom, 1.0)`` with ``denom`` 0 when the drafts so far and the next hold all the target's mass.
    Here a division's new NaN lanes are held; a ``tl.where`` that discards all of them lets
    them go; any left at the launch's end warn at the kernel's line. ``inf - inf`` (vLLM's
    ``_topk_topp_kernel`` compares two infinite bounds) gives its NaN silently, as a GPU does;
    a NaN a kernel stores is judged by the check reading it. Values stay Triton's.
    """
    try:
        # optional: numpy, triton
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if executor is None or not hasattr(builder, "create_fdiv") or "create_select" in vars(builder):
        return False
    divide, select, launch = builder.create_fdiv, builder.create_select, executor.__call__
    subtract = builder.create_fsub

    def create_fsub(lhs: Any, rhs: Any) -> Any:
        with np.errstate(invalid="ignore"):  # inf - inf: a NaN without a word, as on a GPU
            return subtract(lhs, rhs)

    def create_fdiv(lhs: Any, rhs: Any) -> Any:
        with np.errstate(invalid="raise"):  # the rare case pays: a handful of divisions per step
            try:
                return divide(lhs, rhs)
            except FloatingPointError:
                pass
        with np.errstate(invalid="ignore"):
            out = divide(lhs, rhs)
        frame = sys._getframe(1)
        while frame.f_back and frame.f_globals.get("__name__", "").startswith(("triton.", "simrig.triton_")):
            frame = frame.f_back  # up to the kernel's own line
        lanes = np.isnan(out.data) & ~np.isnan(lhs.data) & ~np.isnan(rhs.data)  # new: not a NaN operand's
        registry = frame.f_globals.setdefault("__warningregistry__", {})  # once per line, as warn keeps
        _held[id(out)] = (out, lanes, (frame.f_code.co_filename, frame.f_lineno), registry)
        return out

    def create_select(cond: Any, lhs: Any, rhs: Any) -> Any:
        if _held and lhs is not rhs:
            taken = cond.data != 0
            for side, lanes in ((lhs, taken), (rhs, ~taken)):
                entry = _held.get(id(side))  # (held, so its id is its own)
                if entry is not None and not (entry[1] & lanes).any():
                    del _held[id(side)]
        return select(cond, lhs, rhs)

    def launch_settled(self: Any, *args: Any, **kwargs: Any) -> Any:
        _held.clear()  # what a failed launch left
        out = launch(self, *args, **kwargs)
        for (filename, lineno), registry in {e[2]: e[3] for e in _held.values()}.items():
            warnings.warn_explicit("invalid value encountered in divide", RuntimeWarning, filename, lineno,
                                   registry=registry)
        _held.clear()
        return out

    builder.create_fdiv, builder.create_select, executor.__call__ = create_fdiv, create_select, launch_settled
    builder.create_fsub = create_fsub
    return True


def range_yields_tensors() -> bool:
    """``tl.range``'s loop variable a scalar tensor, as in a compiled kernel. Returns whether
    it was installed (False: a Triton without this layout, or already installed).

    The interpreter maps ``tl.range`` onto Python's ``range``, so a kernel calling a tensor
    method on the variable fails (vLLM's ``_topk_topp_kernel``: ``row_id.to(tl.int64)``,
    "'int' object has no attribute 'to'"). Each value becomes an int32 scalar tensor (int64
    past int32's range); ``tl.static_range`` unrolls at compile time and keeps Python ints.
    """
    try:
        # optional: numpy, triton
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    core, handle = getattr(interpreter, "_patch_lang_core", None), getattr(interpreter, "TensorHandle", None)
    if core is None or handle is None or getattr(core, "__simrig_range__", False):
        return False

    def as_int(value: Any) -> int:
        if isinstance(value, tl.tensor):
            return int(np.asarray(value.handle.data).reshape(-1)[0])
        return int(tl.core._unwrap_if_constexpr(value))

    def tensor_range(arg1: Any, arg2: Any = None, step: Any = None, **kwargs: Any) -> Any:
        start, end = (0, as_int(arg1)) if arg2 is None else (as_int(arg1), as_int(arg2))
        wide = not (-2**31 <= min(start, end) and max(start, end) < 2**31)
        dtype, ty = (np.int64, tl.int64) if wide else (np.int32, tl.int32)
        for i in range(start, end, 1 if step is None else as_int(step)):
            yield tl.tensor(handle(np.array(i, dtype=dtype), ty), ty)

    def patch_lang_core(lang: Any, scope: Any) -> None:
        core(lang, scope)
        scope.set_attr(lang, "range", tensor_range)

    patch_lang_core.__simrig_range__ = True  # type: ignore[attr-defined]
    interpreter._patch_lang_core = patch_lang_core
    return True
