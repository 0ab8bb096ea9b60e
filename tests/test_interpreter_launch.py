"""simrig/triton_interpreter/interpreter_launch.py: a launch handed its CPU tensors in
place, kept argument types and the lean splat answer as Triton's own plumbing
does, and stay out where the layout they expect is missing. (The MRV2 kernels
leaving the same bytes with and without every interpreter patch is
tests/test_interpreter_speed.py's.)"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from simrig.triton_interpreter import interpreter_launch as launch

if importlib.util.find_spec("triton") is None:
    pytest.skip("no Triton", allow_module_level=True)

tl = interpreter = torch = None  # set by _triton, once the platform is chosen


@pytest.fixture(autouse=True, scope="module")
def _triton():
    global tl, interpreter, torch
    from simrig.vllm_runtime import platform

    platform.configure()
    import torch as torch_module
    import triton.language
    from triton.runtime import interpreter as triton_interpreter

    tl, interpreter, torch = triton.language, triton_interpreter, torch_module


def _original(fn):
    while hasattr(fn, "__simrig_original__"):
        fn = fn.__simrig_original__
    return fn


@pytest.fixture
def tritons_own(monkeypatch):
    """Triton's own plumbing at the three patch points, each put back as it
    was after the test (a splat the test installed taken off again, so a
    registry run later in this process finds Triton's own)."""
    executor = interpreter.GridExecutor
    for owner, name in ((executor, "_init_args_hst"), (executor, "_restore_args_dev"), (tl, "str_to_ty")):
        monkeypatch.setattr(owner, name, _original(getattr(owner, name)))
    semantic = interpreter.interpreter_semantic
    if "broadcast_impl_value" in vars(semantic):  # the class's own method shows through
        monkeypatch.delattr(semantic, "broadcast_impl_value")
    yield
    # an instance attribute the test set: monkeypatch (torn down after this) restores one it took off
    vars(semantic).pop("broadcast_impl_value", None)


# ------------------------------------------------------------ args_in_place
def test_cpu_tensors_and_ints_are_handed_over_as_they_are(tritons_own):
    assert launch.args_in_place()
    executor = interpreter.GridExecutor
    base = torch.arange(10, dtype=torch.int64)
    view = base[2:8]
    args, kwargs = executor._init_args_hst(None, (view, 7, None), {"out": base})
    assert args[0] is view and args[1] == 7 and args[2] is None and kwargs["out"] is base
    executor._restore_args_dev(None, (view, 7, None), args, {"out": base}, kwargs)
    assert base.tolist() == list(range(10))  # nothing copied over it


def test_a_tuple_argument_goes_the_original_way(tritons_own):
    assert launch.args_in_place()
    view = torch.arange(6, dtype=torch.int32)[1:]
    args, _ = interpreter.GridExecutor._init_args_hst(None, ((view, view),), {})
    hosted = args[0][0]
    assert hosted is not view and hosted.data_ptr() == view.data_ptr() and hosted.stride() == view.stride()


def test_a_kernel_writes_through_a_view_handed_over_in_place(tritons_own):
    """A kernel adding one to a view of a larger buffer: the view's own elements
    change, and only those."""
    import triton

    assert launch.args_in_place()

    @triton.jit
    def add_one(ptr, n, BLOCK: tl.constexpr):
        offset = tl.arange(0, BLOCK)
        mask = offset < n
        tl.store(ptr + offset, tl.load(ptr + offset, mask=mask) + 1, mask=mask)

    buffer = torch.zeros(12, dtype=torch.int32)
    add_one[(1,)](buffer[3:8], 5, BLOCK=8)
    assert buffer.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0]


# ------------------------------------------------------------ memoise_str_to_ty
def test_kept_argument_types_equal_tritons(tritons_own):
    fresh = tl.str_to_ty
    assert launch.memoise_str_to_ty()
    for name in ("*i32", "*ki64", "*fp16", "i64", "i32", "u64", "i1", "fp32"):
        first, again = tl.str_to_ty(name, None), tl.str_to_ty(name, None)
        assert first is again and first == fresh(name, None) and type(first) is type(fresh(name, None))
    pair = ("i32", "*i64")  # a tuple of names: Triton's, a new type each call
    assert tl.str_to_ty(pair, None) is not tl.str_to_ty(pair, None)


# ------------------------------------------------------------ fast_splat
def _operand(ty, data):
    return tl.tensor(interpreter.TensorHandle(np.asarray(data), ty.scalar), ty)


def _pairs():
    i32x8, i64x2x4 = tl.block_type(tl.int32, [8]), tl.block_type(tl.int64, [2, 4])
    ptrs = tl.block_type(tl.pointer_type(tl.int32), [4])
    return [
        (_operand(i32x8, np.arange(8, dtype=np.int32)), _operand(tl.int32, np.array([5], np.int32))),
        (_operand(tl.int64, np.array([-3], np.int64)), _operand(i64x2x4, np.ones((2, 4), np.int64))),
        (_operand(ptrs, np.arange(4, dtype=np.uint64) * 4), _operand(tl.int32, np.array([2], np.int32))),
        (_operand(i32x8, np.arange(8, dtype=np.int32)), _operand(i32x8, np.full(8, 2, np.int32))),
        (_operand(tl.int32, np.array([1], np.int32)), _operand(tl.int32, np.array([2], np.int32))),
        # a real broadcast between two blocks: Triton's own
        (_operand(tl.block_type(tl.int64, [1, 4]), np.arange(4, dtype=np.int64).reshape(1, 4)),
         _operand(i64x2x4, np.zeros((2, 4), np.int64))),
    ]


def test_the_lean_splat_gives_tritons_operands(tritons_own):
    semantic = interpreter.interpreter_semantic
    triton_answers = [semantic.broadcast_impl_value(lhs, rhs) for lhs, rhs in _pairs()]
    assert launch.fast_splat()
    assert semantic.broadcast_impl_value.__simrig_fast__
    for (lhs, rhs), want in zip(_pairs(), triton_answers):
        got = semantic.broadcast_impl_value(lhs, rhs)
        for a, b in zip(got, want):
            assert a.type == b.type and a.handle.dtype == b.handle.dtype
            assert a.handle.data.dtype == b.handle.data.dtype and np.array_equal(a.handle.data, b.handle.data)
    lhs, rhs = _pairs()[3]  # the same type on both sides: the very operands, as Triton's own
    got = semantic.broadcast_impl_value(lhs, rhs)
    assert got[0] is lhs and got[1] is rhs
    splat = semantic.broadcast_impl_value(*_pairs()[0])[1]
    assert splat.handle.data.tolist() == [5] * 8 and splat.type == tl.block_type(tl.int32, [8])


def test_the_splat_stays_on_the_interpreters_semantic(tritons_own):
    from triton.language import semantic as semantic_module

    assert launch.fast_splat()
    assert not getattr(semantic_module.TritonSemantic.broadcast_impl_value, "__simrig_fast__", False)


# ------------------------------------------------------------ each patch can refuse
@pytest.mark.parametrize("patch, owner, name", [
    ("args_in_place", "executor", "_init_args_hst"),
    ("memoise_str_to_ty", "tl", "str_to_ty"),
])
def test_a_patch_leaves_a_foreign_layout_alone(monkeypatch, tritons_own, patch, owner, name):
    target = interpreter.GridExecutor if owner == "executor" else tl
    monkeypatch.delattr(target, name)
    assert getattr(launch, patch)() is False
    assert not hasattr(target, name)


def test_installed_twice_is_installed_once(tritons_own):
    launch.install_all()
    assert not any(launch.install_all().values())
