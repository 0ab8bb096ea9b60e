"""simrig/triton_interpreter/interpreter_types.py: block types kept and tensors built
from kept attributes answer as Triton's fresh ones do, and stay out where the
layout they expect is missing. (The MRV2 kernels leaving the same bytes with
and without every interpreter patch is tests/test_interpreter_speed.py's.)"""

from __future__ import annotations

import importlib.util

import pytest

from simrig.triton_interpreter import interpreter_types as types_patch
from simrig.triton_interpreter.interpreter_speed import _state

if importlib.util.find_spec("triton") is None:
    pytest.skip("no Triton", allow_module_level=True)

tl = None  # set by _triton, once the platform is chosen (see test_interpreter_speed)


@pytest.fixture(autouse=True, scope="module")
def _triton():
    global tl
    from simrig.vllm_runtime import platform

    platform.configure()
    import triton.language

    tl = triton.language


def _tritons_init(fn):
    while hasattr(fn, "__simrig_original__"):
        fn = fn.__simrig_original__
    return fn


@pytest.fixture
def fresh_patches():
    """Triton's own constructors, then both patches installed on them; the
    constructors as they were put back after the test."""
    core = tl.core
    block, tensor = core.block_type, core.tensor
    saved = {name: vars(block).get(name) for name in ("__new__", "__init__")}
    saved_tensor = tensor.__init__
    semantic_class = _semantic_class()
    saved_check = semantic_class.binary_op_type_checking_impl
    semantic_class.binary_op_type_checking_impl = _tritons_init(saved_check)
    block.__new__ = types_patch.plain_new
    block.__init__, tensor.__init__ = _tritons_init(block.__init__), _tritons_init(tensor.__init__)
    try:
        assert all(types_patch.install_all().values())
        yield core
    finally:
        block.__new__ = saved["__new__"] or types_patch.plain_new
        block.__init__, tensor.__init__ = saved["__init__"], saved_tensor
        semantic_class.binary_op_type_checking_impl = saved_check


def _semantic_class():
    from triton.language import semantic

    return semantic.TritonSemantic


def _built_by_triton(core, element, shape):
    made = object.__new__(core.block_type)
    _tritons_init(core.block_type.__init__)(made, element, shape)
    return made


def test_a_kept_block_type_is_one_instance_equal_to_tritons(fresh_patches):
    core = fresh_patches
    for element, shape in ((tl.int32, [1024]), (tl.int64, core.tuple([4, 2])), (tl.int1, [8]),
                           (tl.pointer_type(tl.int32), [16])):
        first = core.block_type(element, shape)
        again = core.block_type(element, list(shape))
        want = _built_by_triton(core, element, shape)
        assert first is again
        assert first == want and _state(first) == _state(want) and list(vars(first)) == list(vars(want))
        assert str(first) == str(want) and first.numel == want.numel
    # a scalar element is kept by identity: the one passed is the one held
    assert core.block_type(tl.float16, [8]).element_ty is tl.float16
    # an equal pointer type built again finds the same instance
    assert core.block_type(tl.pointer_type(tl.int64), [8]) is core.block_type(tl.pointer_type(tl.int64), [8])
    assert core.block_type(tl.pointer_type(tl.int64), [8]) is not core.block_type(
        tl.pointer_type(tl.int64, const=True), [8])
    assert core.block_type(tl.int32, [8]) is not core.block_type(tl.uint32, [8])


def test_shapes_and_elements_not_kept_are_built_fresh_with_tritons_errors(fresh_patches):
    core = fresh_patches
    for element, shape in ((tl.int32, [core.constexpr(4)]), (tl.int32, (4,)),
                           (tl.pointer_type(tl.pointer_type(tl.int32)), [4])):
        try:
            want = _built_by_triton(core, element, shape)
        except Exception as error:
            with pytest.raises(type(error)):
                core.block_type(element, shape)
            continue
        one, two = core.block_type(element, shape), core.block_type(element, shape)
        assert one is not two and _state(one) == _state(want)
    with pytest.raises(TypeError, match="0d block_type"):
        core.block_type(tl.int32, [])


def test_no_more_than_max_kept(fresh_patches, monkeypatch):
    core = fresh_patches
    kept = core.block_type(tl.int32, [256])
    monkeypatch.setattr(types_patch, "MAX_KEPT", 0)  # read at each build: the table is full
    assert core.block_type(tl.int32, [256]) is kept
    assert core.block_type(tl.int32, [512]) is not core.block_type(tl.int32, [512])


def test_lean_tensors_have_tritons_attributes(fresh_patches):
    core = fresh_patches
    original = _tritons_init(core.tensor.__init__)
    for ty in (tl.int32, tl.int1, core.block_type(tl.int32, [1024]), core.block_type(tl.int64, [4, 2]),
               tl.pointer_type(tl.int32), core.block_type(tl.pointer_type(tl.int32), [4])):
        want = object.__new__(core.tensor)
        original(want, "h", ty)
        for _ in range(2):  # the first builds and keeps, the second is lean
            got = core.tensor("h", ty)
            assert list(vars(got)) == list(vars(want)) and _state(got) == _state(want)
            assert got.type is ty and got.handle == "h"


def test_a_patch_leaves_a_foreign_layout_alone(monkeypatch):
    monkeypatch.delattr(tl.core, "block_type")
    assert types_patch.intern_block_types() is False
    assert types_patch.lean_tensors() is False


def test_installed_twice_is_installed_once(fresh_patches):
    assert not any(types_patch.install_all().values())


def _operands():
    """Tensors of the types the MRV2 kernels combine, with real interpreter
    handles (a cast or broadcast in Triton's path needs them)."""
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    core = tl.core
    out = []
    for ty in (tl.int32, tl.int64, tl.uint32, tl.int1, tl.float32, tl.pointer_type(tl.int32),
               tl.pointer_type(tl.int64)):
        block = core.block_type(ty, [4])
        np_type = np.uint64 if isinstance(ty, core.pointer_type) else {
            "int32": np.int32, "int64": np.int64, "uint32": np.uint32, "int1": np.bool_, "fp32": np.float32}[ty.name]
        out.append(core.tensor(TensorHandle(np.array([3], dtype=np_type), ty), ty))
        out.append(core.tensor(TensorHandle(np.full(4, 3, dtype=np_type), block.element_ty), block))
    return out


def _typed(fn, *args):
    try:
        lhs, rhs = fn(*args)
    except Exception as error:
        return ("error", type(error).__name__, str(error))
    return (str(lhs.type), str(rhs.type), lhs.handle.data.tolist(), rhs.handle.data.tolist()), (lhs, rhs)


def test_fast_binary_typing_answers_as_tritons(fresh_patches):
    from triton.runtime import interpreter

    semantic = interpreter.interpreter_semantic
    fast = _semantic_class().binary_op_type_checking_impl
    original = _tritons_init(fast)
    assert fast is not original and fast.__simrig_fast__
    answered = 0
    for lhs in _operands():
        for rhs in _operands() + [2, -1]:
            for flags in ((False, False, True, False), (True, True, True, False), (True, False, True, False),
                          (False, True, True, False), (False, False, True, True), (False, False, False, True)):
                want, got = _typed(original, semantic, lhs, rhs, *flags), _typed(fast, semantic, lhs, rhs, *flags)
                assert want[0] == got[0], (lhs.type, getattr(rhs, "type", rhs), flags)
                if want[0] != "error" and got[1][0] is lhs and got[1][1] is rhs:
                    answered += 1
                    assert want[1][0] is lhs and want[1][1] is rhs  # Triton hands back the same operands
    assert answered > 20
