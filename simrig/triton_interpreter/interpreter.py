"""Triton's interpreter, run as a GPU runs a kernel compiled without debug.

With ``sanitize_overflow`` on, the interpreter recomputes every narrow integer op in int64
and hands the check to ``device_assert``, which drops it unless ``options.debug`` is set:
about a seventh of a campaign's CPU time for no effect (``skip_dead_overflow_checks`` has
the detail). This module switches that dead work off while debug is off, patches the
language once, routes launches past the coverage sampler and keeps numpy quiet about the 0/0
lanes a ``tl.where`` discards (``quiet_discarded_nans``). Platform plumbing only: no vLLM
code and no kernel body is changed. See docs/setup.md, "Triton's interpreter patches".
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any

from simrig import trace_gate as gate


def skip_dead_overflow_checks() -> bool:
    """Turn ``sanitize_overflow`` off in the interpreter's builder when its
    assertions are off. Returns whether it did (False: debug on, or a Triton
    without this interpreter layout, which is then left as it is).

    On CPU every MRV2 kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``).
    With ``sanitize_overflow`` on (the interpreter's default), every integer
    ``+``, ``-`` and ``*`` narrower than 64 bits is recomputed in int64 and
    compared against the type's bounds, and the result handed to
    ``device_assert``, which ``semantic.device_assert`` drops unless
    ``options.debug`` is set:

        if not self.builder.options.debug:
            return

    So without debug the check is computed and thrown away: about a seventh of a
    campaign's wall time on CPU, for no observable effect. A compiled kernel on a
    GPU has no such check either (assertions are compiled out without debug).
    This module switches the dead work off, and only while the interpreter's
    options say debug is off (a user who turns debug on keeps both).

    Platform plumbing only: no vLLM code and no kernel body is changed.
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
    """Patch ``triton.language`` for the interpreter once, instead of around
    every kernel launch.

    Before each launch the interpreter's ``_patch_lang(fn)`` points every
    builtin of ``tl`` and ``tl.core`` (those visible from the kernel's
    globals) at its numpy semantics, and restores them all after the launch:
    hundreds of ``setattr`` calls per launch, the same ones every time, since
    the patch depends only on which of the two modules the kernel sees. In
    CPU mode no kernel is ever compiled, so the patched language is the only
    one in use: it is applied once, for both modules, and kept. Returns
    whether it did (False: a Triton without this interpreter layout).
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
    """Route every kernel launch through ``simrig.trace_gate.launch``, so a
    running coverage collector traces only the launches its sampler asks for
    (a plain call while none runs). Returns whether it was installed (False:
    a Triton without this interpreter layout, or already installed)."""
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
    """A launch's kernel and its ``tl.constexpr`` values: what a compiled
    kernel is specialised on, so the branches they fix count apart."""
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
    them go; any left at the launch's end warn at the kernel's line. Values stay Triton's.
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
    return True
