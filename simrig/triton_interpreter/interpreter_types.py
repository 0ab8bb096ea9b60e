"""Triton's interpreter, building each op's types once instead of per program.

A kernel body sees a handful of distinct types and runs once per program of its grid, so
the same few type and tensor objects are rebuilt hundreds of thousands of times per
campaign. Each patch here (``intern_block_types``, ``lean_tensors``,
``fast_binary_type_checks``; its docstring says why that is safe) returns what Triton's own
code returns, and is installed only when its probe built both ways agrees. See docs/setup.md,
"Triton's interpreter patches".
"""

from __future__ import annotations

from typing import Any

from simrig.triton_interpreter.interpreter_speed import _state

MAX_KEPT = 4096


def _core_members(*names: str) -> tuple | None:
    """``triton.language.core``'s members by name, or None when Triton or any of them is
    missing (each patch then leaves Triton as it is)."""
    try:
        import triton.language as tl  # optional: triton
    except ImportError:
        return None
    found = tuple(getattr(tl.core, name, None) for name in names)
    return None if any(member is None for member in found) else found


def plain_new(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """``object.__new__`` for a class given back its own constructor: a ``__new__`` once
    assigned cannot be deleted again (CPython then hands the constructor's arguments to
    ``object.__new__``, which refuses them)."""
    return object.__new__(cls)


def _element_key(element: Any, scalar: type, pointer: type) -> Any:
    """The key a block type's element is kept under, or None when it is not a kind kept."""
    kind = type(element)
    if kind is scalar:
        return id(element)
    if kind is pointer and type(element.element_ty) is scalar:
        return ("ptr", id(element.element_ty), element.address_space, element.const)
    return None


def intern_block_types() -> bool:
    """Keep one ``tl.block_type`` per element and shape of plain ints. Returns whether it was
    installed (False: a Triton without this layout, or already installed).

    One instance is kept per element (an exact ``tl.dtype`` by identity, as Triton's
    ``element_ty is tl.float16`` checks need; an exact ``tl.pointer_type`` to one by the
    fields its ``__eq__`` compares, Triton comparing pointer types with ``==`` only) and per
    shape of plain ints. Triton assigns a block type's fields only in its constructor, so
    one shared instance answers every question a fresh one would (``==``, ``name``,
    ``shape``, ``numel``, ``scalar``). Past ``MAX_KEPT``, fresh ones are built as before.
    """
    members = _core_members("block_type", "dtype", "pointer_type", "tuple")
    if members is None or getattr(members[0].__new__, "__simrig_interned__", False):
        return False
    import triton.language as tl  # lazy: triton loads only when this runs

    block, scalar, pointer, tl_tuple = members
    init = block.__init__
    kept: dict[Any, Any] = {}
    # ids of this table's instances: never freed while the table is (it holds them),
    # so an id here is always that instance's; one set per install, as a replaced
    # table's instances can be freed and their ids reused
    kept_ids: set[int] = set()
    # what a key's element holds alive: kept instances keep their element, and a
    # scalar element's id is only a key while that object lives
    anchors: list[Any] = []

    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if cls is block and len(args) == 2 and not kwargs:
            element, shape = args
            kind = type(shape)
            if kind is list or kind is tl_tuple:
                dims = tuple(shape.values) if kind is tl_tuple else tuple(shape)
                for d in dims:
                    if type(d) is not int:
                        break
                else:
                    key = _element_key(element, scalar, pointer)
                    if key is not None:
                        key = (key, dims)
                        found = kept.get(key)
                        if found is not None:
                            return found
                        if len(kept) < MAX_KEPT:
                            made = object.__new__(cls)
                            init(made, element, shape)  # its errors too (a 0-d shape)
                            anchors.append(element)
                            kept[key] = made
                            kept_ids.add(id(made))
                            return made
        return object.__new__(cls)

    def __init__(self: Any, element_ty: Any, shape: Any) -> None:
        if id(self) in kept_ids:  # a kept instance, built once in __new__
            return
        init(self, element_ty, shape)

    try:  # the layout: probes built both ways agree
        probes = ((tl.int32, [4, 8]), (tl.int64, tl_tuple([16])), (tl.pointer_type(tl.int32), [1024]),
                  (tl.int1, [2]), (tl.float32, [1, 2, 4]))
        built = []
        for element, shape in probes:
            fresh = object.__new__(block)
            init(fresh, element, shape)
            built.append(fresh)
    except Exception:
        return False
    __new__.__simrig_interned__ = True  # type: ignore[attr-defined]
    __new__.__simrig_kept_ids__ = kept_ids  # type: ignore[attr-defined]
    __init__.__simrig_original__ = init  # type: ignore[attr-defined]
    block.__new__ = __new__
    block.__init__ = __init__
    try:
        for (element, shape), fresh in zip(probes, built):
            first, again = block(element, shape), block(element, list(shape))
            if (first is not again or _state(first) != _state(fresh) or list(vars(first)) != list(vars(fresh))
                    or not first == fresh):
                raise ValueError("kept block type differs")
    except Exception:
        block.__new__ = plain_new
        block.__init__ = init
        return False
    return True


def lean_tensors() -> bool:
    """Build ``tl.tensor`` of a scalar dtype or a kept block type from attributes kept per
    type. Returns whether it was installed (False: a Triton without this layout, or
    already installed).

    For an exact tensor of such a type it sets the same attributes, in the same order, to
    equal values. A scalar's are fixed (an empty shape, one element, its own type); a kept
    block type's come from the first tensor built with it: its shape's ``constexpr``
    dimensions (in a new ``tl.tuple`` per tensor, as a ``tl.tuple`` can be changed; the
    constexprs shared, as Triton never reassigns their ``value``), ``numel`` and ``dtype``.
    Any other tensor goes to Triton's constructor.
    """
    members = _core_members("tensor", "block_type", "dtype", "pointer_type", "tuple", "constexpr")
    if members is None:
        return False
    tensor, block, scalar, pointer, tl_tuple, constexpr = members
    original = tensor.__init__
    if getattr(original, "__simrig_lean__", False) or not getattr(block.__new__, "__simrig_interned__", False):
        return False
    kept_ids = block.__new__.__simrig_kept_ids__
    one = constexpr(1)  # the element count of every scalar tensor
    no_dims = tl_tuple([]).type  # the type of a scalar's (empty) shape
    per_type: dict[int, tuple] = {}
    new_tuple = tl_tuple.__new__

    def __init__(self: Any, handle: Any, type: Any) -> None:  # noqa: A002 (Triton's name)
        if self.__class__ is tensor:
            kind = type.__class__
            if kind is scalar or kind is pointer:  # a scalar: no shape, one element, its own scalar type
                self.handle = handle
                self.shape = tl_tuple((), no_dims)
                self.numel = one
                self.type = type
                self.dtype = type
                return
            entry = per_type.get(id(type))
            if entry is not None and entry[0] is type:
                self.handle = handle
                shape = new_tuple(tl_tuple)  # its own: a tl.tuple can be changed
                shape.values = list(entry[1].values)  # what tl.tuple(values, type) sets, in its order
                shape.type = entry[1].type
                self.shape = shape
                self.numel = entry[2]
                self.type = type
                self.dtype = entry[3]
                return
        original(self, handle, type)
        if self.__class__ is tensor and id(type) in kept_ids and len(per_type) < MAX_KEPT:
            per_type[id(type)] = (type, self.shape, self.numel, self.dtype)

    __init__.__simrig_lean__ = True  # type: ignore[attr-defined]
    __init__.__simrig_original__ = original  # type: ignore[attr-defined]
    tensor.__init__ = __init__
    return True


def fast_binary_type_checks() -> bool:
    """Answer the operand typing of a binary op directly where it hands back its operands
    unchanged. Returns whether it was installed (False: a Triton without this layout, or
    already installed).

    ``binary_op_type_checking_impl`` (every ``+``, ``-``, ``*``, ``<``, ...) hands its two
    operands back cast and broadcast; it hands back the very operands for the same integer
    type (a type promoted with itself is itself; a cast to a tensor's own type is the
    tensor), or a pointer and an integer of the same shape where the pointer's side allows
    one (no arithmetic typing, no broadcast). Those cases are answered directly; every
    other goes to Triton's.
    """
    members = _core_members("tensor", "block_type", "dtype", "pointer_type", "tuple")
    if members is None:
        return False
    from triton.language import semantic as semantic_module  # lazy: triton loads only when this runs

    tensor, block, scalar, pointer, tl_tuple = members
    owner = getattr(semantic_module, "TritonSemantic", None)
    if owner is None:
        return False
    original = getattr(owner, "binary_op_type_checking_impl", None)
    if original is None or getattr(original, "__simrig_fast__", False):
        return False
    try:
        int_names = frozenset(scalar.SINT_TYPES + scalar.UINT_TYPES)
    except Exception:
        return False

    def _is_int(ty: Any) -> bool:
        return ty.__class__ is scalar and ty.name in int_names

    def binary_op_type_checking_impl(self: Any, lhs: Any, rhs: Any, allow_lhs_ptr: bool = False,
                                     allow_rhs_ptr: bool = False, arithmetic_check: bool = True,
                                     div_or_mod: bool = False) -> Any:
        if lhs.__class__ is tensor and rhs.__class__ is tensor:
            left, right = lhs.type, rhs.type
            if left is right:
                element = left.element_ty if left.__class__ is block else left
                if _is_int(element):
                    return lhs, rhs
            else:
                left_kind, right_kind = left.__class__, right.__class__
                if left_kind is block and right_kind is block:
                    shapes = left.shape, right.shape
                    same = (shapes[0].__class__ is tl_tuple and shapes[1].__class__ is tl_tuple
                            and shapes[0].values == shapes[1].values)
                    left, right = (left.element_ty, right.element_ty) if same else (None, None)
                elif left_kind is block or right_kind is block:
                    left = right = None
                if left is not None:
                    if allow_lhs_ptr and left.__class__ is pointer and _is_int(right):
                        return lhs, rhs
                    if allow_rhs_ptr and right.__class__ is pointer and _is_int(left):
                        return lhs, rhs
        return original(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    binary_op_type_checking_impl.__simrig_fast__ = True  # type: ignore[attr-defined]
    binary_op_type_checking_impl.__simrig_original__ = original  # type: ignore[attr-defined]
    owner.binary_op_type_checking_impl = binary_op_type_checking_impl
    return True


def install_all() -> dict[str, bool]:
    """Every patch, block types first (the tensors keep attributes only for kept block
    types). Returns which were installed."""
    return {"intern_block_types": intern_block_types(), "lean_tensors": lean_tensors(),
            "fast_binary_type_checks": fast_binary_type_checks()}
