"""Triton's interpreter, doing the same work per kernel launch with less overhead.

Most of an interpreted kernel's time is the interpreter's Python layer around each op. Each
patch here (its docstring says what it skips and why that is safe) returns the same values
as the plumbing it replaces, and leaves Triton as it is when the layout it expects is not
there. See docs/setup.md, "Triton's interpreter patches", and docs/benchmarks.md.
"""

from __future__ import annotations

import inspect
import types
from typing import Any


def memoise_np_dtype() -> bool:
    """Keep ``_get_np_dtype``'s answer per scalar dtype name. Returns whether it was
    installed (False: a Triton without this layout, or already installed).

    ``_get_np_dtype`` rebuilds a 19-entry dict of Triton dtype -> numpy dtype on every call
    (tens of thousands per step batch). For an exact ``tl.dtype``, or a ``block_type`` of
    one, the answer depends only on that dtype's ``name`` (the dict's keys compare by name),
    so it is kept per name; anything else goes to the original. Same numpy dtype object
    (numpy interns them), same errors (a KeyError is never kept).
    """
    try:
        # optional: triton
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_get_np_dtype", None)
    scalar, block = getattr(tl, "dtype", None), getattr(tl, "block_type", None)
    if original is None or scalar is None or block is None or getattr(original, "__simrig_memo__", False):
        return False
    try:  # the layout: a scalar dtype maps by name, a block by its element type
        if original(tl.int32) != original(block(tl.int32, [4])):
            return False
    except Exception:
        return False
    by_name: dict[str, Any] = {}

    def _get_np_dtype(tt_dtype: Any) -> Any:
        kind = type(tt_dtype)
        element = tt_dtype.element_ty if kind is block else tt_dtype if kind is scalar else None
        if type(element) is scalar:
            found = by_name.get(element.name)
            if found is None:
                found = by_name[element.name] = original(element)
            return found
        return original(tt_dtype)

    _get_np_dtype.__simrig_memo__ = True  # type: ignore[attr-defined]
    _get_np_dtype.__simrig_original__ = original  # type: ignore[attr-defined]
    interpreter._get_np_dtype = _get_np_dtype
    return True


def _builtin_target(member: Any, wrapper_code: Any) -> Any:
    """The function under Triton's ``@builtin`` wrapper ``member``, or None when it is not one."""
    if getattr(member, "__code__", None) is not wrapper_code:
        return None
    cells = dict(zip(member.__code__.co_freevars, member.__closure__ or ()))
    cell = cells.get("fn")
    return cell.cell_contents if cell is not None else None


def lean_builtin_calls() -> bool:
    """Replace the interpreter's ``_patch_attr`` with one whose wrappers call the builtin's
    function directly. Returns whether it was installed (False: a Triton without this
    layout, or already installed).

    Each builtin the interpreter patches is a lambda that copies its kwargs without
    ``_semantic`` and calls the ``@builtin`` wrapper, which checks ``_semantic`` is given.
    The lean wrapper swaps ``_semantic`` for the interpreter's (last, the same order) in the
    already fresh kwargs and calls the function under ``@builtin``: the skipped check can
    never fail. Any other member is called through. Must go in before
    ``interpreter.patch_language_once`` (which applies it once, through ``_patch_attr``).
    """
    try:
        # optional: triton
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_attr", None)
    semantic = getattr(interpreter, "interpreter_semantic", None)
    make_builtin = getattr(tl.core, "builtin", None)
    if original is None or semantic is None or make_builtin is None or getattr(original, "__simrig_lean__", False):
        return False
    try:
        if list(inspect.signature(original).parameters) != ["obj", "name", "member", "builder", "scope"]:
            return False
        probe = make_builtin(lambda _semantic=None: _semantic)
    except Exception:
        return False
    wrapper_code = getattr(probe, "__code__", None)
    if _builtin_target(probe, wrapper_code) is None:
        return False

    def _patch_attr(obj: Any, name: str, member: Any, builder: Any, scope: Any) -> None:
        target = _builtin_target(member, wrapper_code)
        call = member if target is None else target

        def new_member(*args: Any, **kwargs: Any) -> Any:
            if kwargs:
                kwargs.pop("_semantic", None)
            kwargs["_semantic"] = semantic
            return call(*args, **kwargs)

        scope.set_attr(obj, name, new_member)

    _patch_attr.__simrig_lean__ = True  # type: ignore[attr-defined]
    _patch_attr.__simrig_original__ = original  # type: ignore[attr-defined]
    interpreter._patch_attr = _patch_attr
    return True


class _Inspect(types.ModuleType):
    """``inspect`` for Triton's interpreter module: everything forwarded, but ``getfullargspec``
    kept per function and ``getcallargs`` bound directly for plain functions."""

    def __init__(self) -> None:
        super().__init__("inspect")
        self._specs: dict[Any, tuple] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    def _spec(self, fn: Any) -> Any:
        kept = self._specs.get(fn)
        if (kept is not None and kept[1] is fn.__code__ and kept[2] is fn.__defaults__
                and kept[3] is fn.__kwdefaults__ and kept[4] is fn.__annotations__):
            return kept[0]
        spec = inspect.getfullargspec(fn)
        if "__signature__" not in fn.__dict__:
            self._specs[fn] = (spec, fn.__code__, fn.__defaults__, fn.__kwdefaults__, fn.__annotations__)
        return spec

    def getfullargspec(self, fn: Any) -> Any:
        if type(fn) is not types.FunctionType:
            return inspect.getfullargspec(fn)
        return self._spec(fn)

    def getcallargs(self, fn: Any, /, *positional: Any, **named: Any) -> dict:
        if type(fn) is not types.FunctionType:
            return inspect.getcallargs(fn, *positional, **named)
        spec = self._spec(fn)
        names = spec.args
        if spec.varargs or spec.varkw or spec.kwonlyargs or len(positional) > len(names):
            return inspect.getcallargs(fn, *positional, **named)
        bound = dict(zip(names, positional))
        for kw, value in named.items():
            if kw in bound or kw not in names:
                return inspect.getcallargs(fn, *positional, **named)  # its error
            bound[kw] = value
        if len(bound) < len(names):
            defaults = spec.defaults or ()
            first_default = len(names) - len(defaults)
            for at, name in enumerate(names):
                if name not in bound:
                    if at < first_default:
                        return inspect.getcallargs(fn, *positional, **named)  # its error
                    bound[name] = defaults[at - first_default]
        return bound


def cache_launch_binding() -> bool:
    """Give the interpreter module an ``inspect`` that keeps each kernel's argument spec and
    binds its arguments without a Signature. Returns whether it was installed (False: a
    Triton without this layout, or already installed).

    Every launch calls ``getfullargspec`` and ``getcallargs`` on the kernel: a full
    ``inspect.Signature`` each time. The stand-in (``_Inspect``) keeps the spec per function
    while its code, defaults and annotations are the same objects, and binds a plain
    function's positional-or-keyword parameters in ``getcallargs``'s order (positionals,
    keywords as given, then defaults); anything else, and every call it would reject, goes
    to ``inspect`` (so the same error).
    """
    try:
        from triton.runtime import interpreter  # optional: triton
    except ImportError:
        return False
    if getattr(interpreter, "inspect", None) is not inspect or not hasattr(interpreter, "GridExecutor"):
        return False
    interpreter.inspect = _Inspect()
    return True


def fast_unwrap_constexpr() -> bool:
    """Answer ``_unwrap_if_constexpr`` for exact tensors, ints and constexprs without its
    isinstance chain. Returns whether it was installed (False: a Triton without this
    layout, or already installed).

    It is called about a million times per campaign, mostly with a ``tl.tensor``, an ``int``
    or a ``tl.constexpr``, and runs four ``isinstance`` checks. The fast path answers for
    exactly those types (``o``, or an exact constexpr's ``o.value``); every other value,
    subclasses included, goes to the original. ``semantic`` reaches it through the core
    module, so that one attribute is enough.
    """
    try:
        import triton.language as tl  # optional: triton
    except ImportError:
        return False
    core = tl.core
    original = getattr(core, "_unwrap_if_constexpr", None)
    constexpr, tensor = getattr(core, "constexpr", None), getattr(core, "tensor", None)
    if original is None or constexpr is None or tensor is None or getattr(original, "__simrig_fast__", False):
        return False
    try:  # the layout: a constexpr unwraps to its value, anything plain to itself
        probe = tensor.__new__(tensor)
        if original(constexpr(3)) != 3 or original(probe) is not probe or original(5) != 5:
            return False
    except Exception:
        return False
    # exact types that are neither list, tuple, tl.tuple nor constexpr: themselves
    plain = frozenset({tensor, int, bool, float, str, type(None)})

    def _unwrap_if_constexpr(o: Any) -> Any:
        kind = type(o)
        if kind is constexpr:
            return o.value
        if kind in plain:
            return o
        return original(o)

    _unwrap_if_constexpr.__simrig_fast__ = True  # type: ignore[attr-defined]
    _unwrap_if_constexpr.__simrig_original__ = original  # type: ignore[attr-defined]
    core._unwrap_if_constexpr = _unwrap_if_constexpr
    return True


def _state(value: Any, depth: int = 0) -> Any:
    """A value's attributes, recursively, as plain data: what a probe built by Triton's
    constructor and by the lean one must agree on."""
    if depth > 6 or isinstance(value, (int, float, str, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_state(v, depth + 1) for v in value])
    attrs = getattr(value, "__dict__", None)
    if attrs is None or isinstance(value, type) or not type(value).__module__.startswith("triton.language"):
        return repr(value)
    return (type(value).__name__, [(k, _state(v, depth + 1)) for k, v in attrs.items()])


def lean_block_type() -> bool:
    """Build ``tl.block_type`` from a shape of plain ints without the generic unwrapping its
    constructor does. Returns whether it was installed (False: a Triton without this
    layout, or already installed).

    A block type is built two or three times per op, each time unwrapping the shape through
    ``_unwrap_shape`` (a new ``tl.tuple``, two list copies) and ``_type_for_tuple_values``.
    For a shape that is exactly a ``list`` or ``tl.tuple`` of exact ``int`` (what those
    callers pass) the lean constructor sets the same attributes, in the same order, to equal
    values: the ints' ``tl.tuple`` typed by their ``constexpr_type``,
    ``validate_block_shape``'s numel (and errors), the same name. Anything else goes to
    Triton's constructor.
    """
    try:
        import triton.language as tl  # optional: triton
    except ImportError:
        return False
    core = tl.core
    block, tl_tuple = getattr(core, "block_type", None), getattr(core, "tuple", None)
    tuple_type, constexpr_type = getattr(core, "tuple_type", None), getattr(core, "constexpr_type", None)
    constexpr, validate = getattr(core, "constexpr", None), getattr(core, "validate_block_shape", None)
    if None in (block, tl_tuple, tuple_type, constexpr_type, constexpr, validate):
        return False
    original = block.__init__
    wrapped = original
    while wrapped is not None:  # already lean, or under a wrapper of the lean one (interpreter_types)
        if getattr(wrapped, "__simrig_lean__", False):
            return False
        wrapped = getattr(wrapped, "__simrig_original__", None)

    def __init__(self: Any, element_ty: Any, shape: Any) -> None:
        kind = type(shape)
        if kind is not tl_tuple and kind is not list:  # (a builtin tuple fails the original's assert)
            return original(self, element_ty, shape)
        dims = list(shape)
        for d in dims:
            if type(d) is not int:
                return original(self, element_ty, shape)
        self.element_ty = element_ty
        self.shape = tl_tuple(dims, tuple_type([constexpr_type(d) for d in dims]))
        if not self.shape:
            raise TypeError('0d block_type is forbidden')
        self.numel = validate(self.shape)
        self.name = f'<{self.shape}, {self.element_ty}>'

    __init__.__simrig_lean__ = True  # type: ignore[attr-defined]
    __init__.__simrig_original__ = original  # type: ignore[attr-defined]
    block.__init__ = __init__
    return True


def install_all() -> dict[str, bool]:
    """Every patch above, in the order they need (``lean_builtin_calls``
    before the language is patched). Returns which were installed."""
    return {
        "memoise_np_dtype": memoise_np_dtype(),
        "lean_builtin_calls": lean_builtin_calls(),
        "cache_launch_binding": cache_launch_binding(),
        "fast_unwrap_constexpr": fast_unwrap_constexpr(),
        "lean_block_type": lean_block_type(),
    }
