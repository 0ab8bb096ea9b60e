"""Every patch to Triton's interpreter: its target, its probe, the Triton it is known good on.

Each probe is a small computation whose answer is plain data, run by the registry with
Triton's code as it stands and again with the patch: the same op's values and types, or, for
the patches that act around a whole launch, the bytes a tiny kernel leaves (``kernel_bytes``).
``PATCHES`` is in install order (``lean_builtin_calls`` before the language is patched once;
block types kept before tensors and splats that keep answers per kept type). A patch with
``required`` set is no speed-up and stays on under ``SIMRIG_INTERPRETER_SPEEDUPS=0``; that
turns every other one off.
"""

from __future__ import annotations

import warnings
from typing import Any

from simrig.triton_interpreter import interpreter, interpreter_launch, interpreter_speed, interpreter_types
from simrig.triton_interpreter.interpreter_speed import _state
from simrig.triton_interpreter.registry import Patch

# verified here by tests/test_interpreter_*.py and the launch-by-launch replay comparison
KNOWN_GOOD = ("3.7.1",)
INTERP = "triton.runtime.interpreter"
_kernel: Any = None


def kernel_bytes() -> list:
    """A tiny kernel's output, as Triton's interpreter leaves it: masked loads and stores,
    scalar and constexpr operands, a default and a keyword argument."""
    global _kernel
    # lazy: torch and triton load only when this runs
    import torch
    import triton
    import triton.language as tl

    if _kernel is None:  # made on first use: TRITON_INTERPRET=1 is set by then
        @triton.jit
        def probe_kernel(src, dst, n, scale, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 3):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(src + offs, mask=mask, other=-1)
            y = tl.where(x > 4, x * scale + SHIFT, x - 1)
            tl.store(dst + offs, y.to(tl.int64) + tl.sum(x, axis=0), mask=mask)

        _kernel = probe_kernel
    src = torch.arange(20, dtype=torch.int32)
    dst = torch.full((24,), -7, dtype=torch.int64)
    _kernel[(3,)](src, dst[2:], 19, scale=5, BLOCK=8)
    return [str(dst.dtype), dst.tolist()]


def _np_dtypes() -> list:
    # lazy: triton loads only when this runs
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    scalars = [tl.int1, tl.int8, tl.uint8, tl.int32, tl.uint32, tl.int64, tl.float16, tl.bfloat16, tl.float32]
    types = [*scalars, *(tl.block_type(s, [4, 2]) for s in scalars), tl.pointer_type(tl.int32)]
    return [str(triton_interpreter._get_np_dtype(t)) for t in types]


def _bindings() -> list:
    """What the interpreter module's ``inspect`` answers for a launch's binding."""
    from triton.runtime import interpreter as triton_interpreter  # lazy: triton loads only when this runs

    def kernel(a, b, c=3, d=None):
        pass

    spec = triton_interpreter.inspect.getfullargspec(kernel)
    out: list = [list(spec.args), spec.defaults]
    for args, kwargs in (((1, 2), {}), ((1,), {"b": 2, "d": 4}), ((), {"a": 1, "b": 2, "c": 5}), ((1,), {})):
        try:
            out.append(sorted(triton_interpreter.inspect.getcallargs(kernel, *args, **kwargs).items()))
        except TypeError as exc:
            out.append(str(exc))
    return out + kernel_bytes()


def _unwrapped() -> list:
    import triton.language as tl  # lazy: triton loads only when this runs

    values = [tl.constexpr(3), 5, True, 1.5, "s", None, (tl.constexpr(2), 4), [tl.constexpr(1)], tl.constexpr(None)]
    return [_state(tl.core._unwrap_if_constexpr(v)) for v in values]


def _block_types() -> list:
    import triton.language as tl  # lazy: triton loads only when this runs

    shapes = ([4, 8], tl.core.tuple([16]), tl.core.tuple([tl.constexpr(2), 4]), [tl.constexpr(8)], [1, 2, 4])
    elements = (tl.int32, tl.float32, tl.pointer_type(tl.int64), tl.int1, tl.uint8)
    return [_state(tl.block_type(e, s)) for e, s in zip(elements, shapes) for _ in range(2)]


def _tensors() -> list:
    import triton.language as tl  # lazy: triton loads only when this runs

    types = (tl.int32, tl.block_type(tl.int32, [1024]), tl.block_type(tl.pointer_type(tl.int64), [4, 2]),
             tl.int1, tl.pointer_type(tl.int32), tl.void)
    return [_state(tl.tensor(None, ty)) for ty in types for _ in range(2)]


def _binary_typing() -> list:
    """Which operands the binary-op typing hands back, and their types."""
    # lazy: triton loads only when this runs
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    semantic = triton_interpreter.interpreter_semantic

    def operand(ty: Any) -> Any:
        made = tl.tensor.__new__(tl.tensor)
        made.handle, made.shape, made.type, made.dtype = None, (), ty, ty.scalar
        return made

    i32 = tl.block_type(tl.int32, [8])
    cases = [(tl.int32, tl.int32, (False, False, True, False)), (i32, i32, (False, False, True, True)),
             (tl.uint32, tl.uint32, (False, False, False, True)),
             (tl.pointer_type(tl.int32), tl.int64, (True, True, True, False)),
             (tl.int32, tl.pointer_type(tl.int64), (True, True, True, False)),
             (tl.block_type(tl.pointer_type(tl.int32), [8]), i32, (True, False, True, False)),
             (tl.block_type(tl.pointer_type(tl.int64), [8]), tl.block_type(tl.int64, [8]), (True, True, True, False))]
    out = []
    for left, right, flags in cases:
        lhs, rhs = operand(left), operand(right)
        got = semantic.binary_op_type_checking_impl(lhs, rhs, *flags)
        out.append([got[0] is lhs, got[1] is rhs, str(got[0].type), str(got[1].type)])
    return out


def _str_types() -> list:
    import triton.language as tl  # lazy: triton loads only when this runs

    return [_state(tl.str_to_ty(name, None)) for name in ("*i32", "*ki64", "i64", "i32", "u64", "fp32", "i1")]


def _splats() -> list:
    """A block and a scalar broadcast both ways: types and data."""
    # lazy: numpy loads only when this runs; lazy: triton loads only when this runs
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    semantic = triton_interpreter.interpreter_semantic

    def operand(ty: Any, data: Any) -> Any:
        return tl.tensor(triton_interpreter.TensorHandle(np.asarray(data), ty.scalar), ty)

    block = tl.block_type(tl.int32, [8])
    pairs = [(operand(block, np.arange(8, dtype=np.int32)), operand(tl.int32, np.array([3], np.int32))),
             (operand(tl.int64, np.array([-2], np.int64)), operand(tl.block_type(tl.int64, [2, 4]),
                                                                   np.zeros((2, 4), np.int64))),
             (operand(block, np.arange(8, dtype=np.int32)), operand(block, np.ones(8, np.int32))),
             (operand(tl.int32, np.array([1], np.int32)), operand(tl.int32, np.array([2], np.int32)))]
    out = []
    for lhs, rhs in pairs:
        for t in semantic.broadcast_impl_value(lhs, rhs):
            out.append([str(t.type), str(t.handle.dtype), str(t.handle.data.dtype), t.handle.data.tolist()])
    return out


def _launch_options() -> list:
    from triton.runtime import interpreter as triton_interpreter  # lazy: triton loads only when this runs

    return [bool(getattr(triton_interpreter.interpreter_builder.options, "debug", True))] + kernel_bytes()


def _divisions() -> list:
    """Float divisions with 0/0 lanes, a ``tl.where`` discarding some: values and dtypes."""
    # lazy: numpy loads only when this runs; lazy: triton loads only when this runs
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    builder, handle = triton_interpreter.interpreter_builder, triton_interpreter.TensorHandle
    num, den = (handle(np.array(v, np.float32), tl.float32) for v in ([0, 1, 0, np.inf, np.nan],
                                                                      [0, 2, 0, np.inf, 1]))
    with warnings.catch_warnings():  # Triton's own answer warns
        warnings.simplefilter("ignore", RuntimeWarning)
        quotient = builder.create_fdiv(num, den)
        kept = builder.create_select(handle(den.data > 1, tl.int1), quotient, num)
        return [repr(h.data.tolist()) + str(h.data.dtype) for h in (quotient, kept)] + kernel_bytes()


def _ranges() -> list:
    """A ``tl.range`` loop's sum (the variable used only as an int would be), and the tiny kernel."""
    # lazy: torch and triton load only when this runs
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def range_kernel(src, dst, n):
        acc = tl.load(src)
        for i in tl.range(1, n, 2):
            acc += tl.load(src + i) * i
        tl.store(dst, acc)

    dst = torch.zeros(1, dtype=torch.int64)
    range_kernel[(1,)](torch.arange(9, dtype=torch.int64), dst, 9)
    return dst.tolist() + kernel_bytes()


def _undo_language_once() -> None:
    """The language patched once, put back through the scope Triton's ``_patch_lang`` returned."""
    from triton.runtime import interpreter as triton_interpreter  # lazy: triton loads only when this runs

    scope = getattr(triton_interpreter._patch_lang, "__simrig_scope__", None)
    if scope is not None:
        scope.restore()


def _speed(name: str, module: str, attrs: tuple[str, ...], install: Any, probe: Any, **kw: Any) -> Patch:
    return Patch(name, module, attrs, install, probe, KNOWN_GOOD, **kw)


PATCHES: tuple[Patch, ...] = (
    _speed("skip_dead_overflow_checks", INTERP, ("interpreter_builder.options",),
           interpreter.skip_dead_overflow_checks, _launch_options),
    _speed("memoise_np_dtype", INTERP, ("_get_np_dtype",), interpreter_speed.memoise_np_dtype, _np_dtypes),
    _speed("lean_builtin_calls", INTERP, ("_patch_attr",), interpreter_speed.lean_builtin_calls, kernel_bytes),
    _speed("cache_launch_binding", INTERP, ("inspect",), interpreter_speed.cache_launch_binding, _bindings),
    _speed("fast_unwrap_constexpr", "triton.language.core", ("_unwrap_if_constexpr",),
           interpreter_speed.fast_unwrap_constexpr, _unwrapped),
    _speed("lean_block_type", "triton.language.core", ("block_type.__init__",),
           interpreter_speed.lean_block_type, _block_types),
    _speed("intern_block_types", "triton.language.core", ("block_type.__new__", "block_type.__init__"),
           interpreter_types.intern_block_types, _block_types),
    _speed("lean_tensors", "triton.language.core", ("tensor.__init__",), interpreter_types.lean_tensors,
           _tensors, needs=("intern_block_types",)),
    _speed("fast_binary_type_checks", "triton.language.semantic", ("TritonSemantic.binary_op_type_checking_impl",),
           interpreter_types.fast_binary_type_checks, _binary_typing),
    _speed("args_in_place", INTERP, ("GridExecutor._init_args_hst", "GridExecutor._restore_args_dev"),
           interpreter_launch.args_in_place, kernel_bytes),
    _speed("memoise_str_to_ty", "triton.language", ("str_to_ty",), interpreter_launch.memoise_str_to_ty,
           _str_types),
    _speed("fast_splat", INTERP, ("interpreter_semantic.broadcast_impl_value",), interpreter_launch.fast_splat,
           _splats),
    _speed("range_yields_tensors", INTERP, ("_patch_lang_core",), interpreter.range_yields_tensors, _ranges,
           required="not a speed-up: vLLM's top-k/top-p kernel calls .to() on tl.range's variable"),
    # after every patch that goes through _patch_attr, which it applies once for good
    _speed("patch_language_once", INTERP, ("_patch_lang",), interpreter.patch_language_once, kernel_bytes,
           undo=_undo_language_once),
    _speed("sample_traced_launches", INTERP, ("GridExecutor.__call__",), interpreter.sample_traced_launches,
           kernel_bytes),
    _speed("quiet_discarded_nans", INTERP, ("interpreter_builder.create_fdiv", "interpreter_builder.create_select",
                                            "interpreter_builder.create_fsub", "GridExecutor.__call__"), interpreter.quiet_discarded_nans, _divisions,
           required="not a speed-up: no numpy warning for a 0/0 lane a tl.where discards (a GPU gives none)"),
)


def by_name(name: str) -> Patch:
    return next(p for p in PATCHES if p.name == name)


def describe() -> list[str]:
    """One line per patch: its name, target and known-good Triton versions."""
    return [f"{p.name}: {p.target} (known good: {', '.join(p.known_good)})" for p in PATCHES]

