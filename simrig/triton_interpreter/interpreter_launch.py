"""Triton's interpreter, launching a kernel and splatting a scalar with less overhead.

The last of the interpreter plumbing a campaign's profile showed: work per launch and per
scalar operand that leads to the same memory, types and values either way. Each patch (its
docstring says what it skips and why that is safe) leaves Triton as it is when the layout
it expects is not there, and is checked on install. See docs/setup.md, "Triton's
interpreter patches".
"""

from __future__ import annotations

import types
from typing import Any

from simrig.triton_interpreter.interpreter_types import MAX_KEPT, _core_members


def args_in_place() -> bool:
    """Hand a launch its CPU tensors as they are. Returns whether it was installed (False:
    a Triton without this layout, or already installed).

    ``GridExecutor`` copies every tensor argument "to the host" before a launch (a new
    tensor over its storage's ``cpu()``: for a CPU storage, that storage itself) and back
    after it (onto the same memory, on CPU). When every argument is an exact
    ``torch.Tensor`` on the CPU or no tensor at all, the kernel is handed the arguments
    themselves: the same data pointers, so the same reads and writes, nothing to copy back.
    A tuple, a tensor descriptor, a wrapped or subclassed tensor, or one on another device
    goes the original way.
    """
    try:
        # optional: torch, triton
        import torch
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    to_host = getattr(executor, "_init_args_hst", None)
    restore = getattr(executor, "_restore_args_dev", None)
    if to_host is None or restore is None or getattr(to_host, "__simrig_in_place__", False):
        return False
    plain = torch.Tensor

    def _in_place(values: Any) -> bool:
        for value in values:
            if value.__class__ is plain:
                if value.device.type != "cpu":
                    return False
            elif isinstance(value, (tuple, list)) or hasattr(value, "data_ptr") or hasattr(value, "base"):
                return False  # a tuple, a wrapped or subclassed tensor, a tensor descriptor
        return True

    def _init_args_hst(self: Any, args_dev: Any, kwargs: dict) -> Any:
        if _in_place(args_dev) and _in_place(kwargs.values()):
            return list(args_dev), dict(kwargs)
        return to_host(self, args_dev, kwargs)

    def _restore_args_dev(self: Any, args_dev: Any, args_hst: Any, kwargs: dict, kwargs_hst: dict) -> None:
        if (len(args_dev) == len(args_hst) and all(d is h for d, h in zip(args_dev, args_hst))
                and all(kwargs[name] is kwargs_hst.get(name) for name in kwargs)):
            return  # handed over in place: the kernel wrote the tensors' own memory
        restore(self, args_dev, args_hst, kwargs, kwargs_hst)

    try:  # the layout: Triton's host copy of a CPU tensor is a view of the same memory
        probe = torch.arange(6, dtype=torch.int32)[1:5]
        hosted, _ = to_host(None, [probe, 3], {})
        if (hosted[0].data_ptr() != probe.data_ptr() or hosted[0].stride() != probe.stride()
                or hosted[0].shape != probe.shape or hosted[1] != 3):
            return False
    except Exception:
        return False
    _init_args_hst.__simrig_in_place__ = True  # type: ignore[attr-defined]
    _init_args_hst.__simrig_original__ = to_host  # type: ignore[attr-defined]
    _restore_args_dev.__simrig_original__ = restore  # type: ignore[attr-defined]
    executor._init_args_hst = _init_args_hst
    executor._restore_args_dev = _restore_args_dev
    return True


def memoise_str_to_ty() -> bool:
    """Keep ``tl.str_to_ty``'s type per plain name. Returns whether it was installed (False:
    a Triton without it, or already installed).

    Every launch types each argument with ``tl.str_to_ty(mangled name)``, which parses the
    name (``"*i32"``) and builds a new type. A type never changes after its constructor, so
    a plain name's answer is kept; a tuple of names or a non-None second argument goes to
    Triton's.
    """
    try:
        import triton.language as tl  # optional: triton
    except ImportError:
        return False
    original = getattr(tl, "str_to_ty", None)
    if original is None or getattr(original, "__simrig_memo__", False):
        return False
    kept: dict[str, Any] = {}

    def str_to_ty(name: Any, c: Any) -> Any:
        if c is None and name.__class__ is str:
            found = kept.get(name)
            if found is None:
                found = original(name, c)
                if len(kept) < MAX_KEPT:
                    kept[name] = found
            return found
        return original(name, c)

    try:  # the layout: the kept answer equals a fresh one
        for name in ("*i32", "*ki64", "i64", "i32", "u64", "fp32", "i1"):
            if str_to_ty(name, None) != original(name, None):
                return False
    except Exception:
        return False
    str_to_ty.__simrig_memo__ = True  # type: ignore[attr-defined]
    str_to_ty.__simrig_original__ = original  # type: ignore[attr-defined]
    tl.str_to_ty = str_to_ty
    return True


def fast_splat() -> bool:
    """Splat a scalar operand without lowering its type twice. Returns whether it was
    installed (False: a Triton without this layout, or already installed).

    ``broadcast_impl_value(block, scalar)`` (``offset < n``, ``x + 1``) splats the scalar:
    the block's type with the scalar's element, lowered through ``to_ir`` (in the
    interpreter, an equal block type again) for ``create_splat``, which reads only its
    shape. The fast path hands ``create_splat`` the type itself, keeping
    ``with_element_ty``'s answer per kept block type and element; two operands of the very
    same type come back as they are, as Triton hands them back; every other pair goes to
    Triton's. Only the interpreter's semantic instance is patched, not the compiler's class.
    """
    members = _core_members("block_type", "dtype", "pointer_type")
    if members is None:
        return False
    from triton.runtime import interpreter  # lazy: triton loads only when this runs

    block, scalar, pointer = members
    semantic = getattr(interpreter, "interpreter_semantic", None)
    original = getattr(semantic, "broadcast_impl_value", None)
    if original is None or getattr(original, "__simrig_fast__", False):
        return False
    kept_ids = getattr(block.__new__, "__simrig_kept_ids__", frozenset())
    with_element: dict[tuple[int, int], tuple] = {}

    def _splat_type(block_ty: Any, element: Any) -> Any:
        key = (id(block_ty), id(element))
        entry = with_element.get(key)
        if entry is not None and entry[0] is block_ty and entry[1] is element:
            return entry[2]
        made = block_ty.with_element_ty(element)
        if id(block_ty) in kept_ids and len(with_element) < MAX_KEPT:
            with_element[key] = (block_ty, element, made)  # holds both: the ids stay theirs
        return made

    def broadcast_impl_value(self: Any, lhs: Any, rhs: Any) -> Any:
        left, right = lhs.type, rhs.type
        if left is right:
            if left.__class__ in (block, scalar, pointer):
                return lhs, rhs
        elif left.__class__ is block and right.__class__ in (scalar, pointer):
            ty = _splat_type(left, right.scalar)
            return lhs, self.tensor(self.builder.create_splat(ty, rhs.handle), ty)
        elif right.__class__ is block and left.__class__ in (scalar, pointer):
            ty = _splat_type(right, left.scalar)
            return self.tensor(self.builder.create_splat(ty, lhs.handle), ty), rhs
        return original(lhs, rhs)

    bound = types.MethodType(broadcast_impl_value, semantic)
    broadcast_impl_value.__simrig_fast__ = True  # type: ignore[attr-defined]
    bound.__func__.__simrig_original__ = original  # type: ignore[attr-defined]
    semantic.broadcast_impl_value = bound
    return True


def install_all() -> dict[str, bool]:
    """Every patch above (after ``interpreter_types``: the splat keeps answers only for kept
    block types). Returns which were installed."""
    return {"args_in_place": args_in_place(), "memoise_str_to_ty": memoise_str_to_ty(),
            "fast_splat": fast_splat()}
