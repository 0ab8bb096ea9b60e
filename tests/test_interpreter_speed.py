"""simrig/triton_interpreter/interpreter_speed.py: Triton's interpreter plumbing made
cheaper gives the same answers as Triton's own, is installed in CPU mode, and
stays out where the layout it expects is missing."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import importlib.util

import pytest

from simrig.triton_interpreter import interpreter_speed as speed

if importlib.util.find_spec("triton") is None:
    pytest.skip("no Triton", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "traces" / "samples"
tl = interpreter = None  # set by _triton: imported only once the platform is chosen


@pytest.fixture(autouse=True, scope="module")
def _triton():
    """Triton imported after the platform is configured: triton.language made
    before TRITON_INTERPRET=1 is set would hold compiled @jit helpers (tl.max,
    ...) that a later interpreted kernel in this process cannot call."""
    global tl, interpreter
    from simrig.vllm_runtime import platform

    platform.configure()
    import triton.language
    from triton.runtime import interpreter as triton_interpreter

    tl, interpreter = triton.language, triton_interpreter


def _original(fn):
    while hasattr(fn, "__simrig_original__"):  # interpreter_types wraps interpreter_speed's wrapper
        fn = fn.__simrig_original__
    return fn


# ------------------------------------------------------------ each patch answers as Triton does
def _dtypes():
    scalars = [getattr(tl, name) for name in (
        "int1", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
        "bfloat16", "float32", "float64", "float8e5", "float8e4nv", "float8e4b15", "float8e5b16", "float8e4b8")]
    out = list(scalars)
    out += [tl.block_type(s, [4, 2]) for s in scalars]
    out += [tl.pointer_type(tl.int32), tl.block_type(tl.pointer_type(tl.float16), [8]), tl.void]
    return out


def test_memoised_np_dtype_matches_tritons(monkeypatch):
    monkeypatch.setattr(interpreter, "_get_np_dtype", _original(interpreter._get_np_dtype))
    original = interpreter._get_np_dtype
    assert speed.memoise_np_dtype() is True
    fast = interpreter._get_np_dtype
    assert fast is not original and fast.__simrig_memo__
    for _ in range(2):  # the first call fills the memo, the second reads it
        for ty in _dtypes():
            try:
                want = original(ty)
            except KeyError:
                with pytest.raises(KeyError):
                    fast(ty)
                continue
            assert fast(ty) is want, ty


def test_lean_builtin_wrapper_calls_as_tritons(monkeypatch):
    monkeypatch.setattr(interpreter, "_patch_attr", _original(interpreter._patch_attr))
    assert speed.lean_builtin_calls() is True
    semantic = interpreter.interpreter_semantic
    seen = []

    @tl.core.builtin
    def op(a, b=2, *, c=3, _semantic=None):
        seen.append((a, b, c, _semantic))
        return a + b + c

    class Owner:
        pass

    class Scope:
        def set_attr(self, obj, name, value):
            setattr(obj, name, value)

    for patch in (_original(interpreter._patch_attr), interpreter._patch_attr):
        patch(Owner, "op", op, None, Scope())
        assert Owner.op(1) == 6
        assert Owner.op(1, 5, c=0, _semantic="another") == 6  # a _semantic passed in is replaced
    assert seen == [(1, 2, 3, semantic), (1, 5, 0, semantic)] * 2
    # a member that is not Triton's @builtin wrapper is called through, as before
    plain = lambda *args, **kwargs: (args, sorted(kwargs))  # noqa: E731
    interpreter._patch_attr(Owner, "plain", plain, None, Scope())
    assert Owner.plain(1, x=2) == ((1,), ["_semantic", "x"])


def test_launch_binding_matches_inspect():
    fake = speed._Inspect()

    def kernel(a, b, c=3, D=4):
        pass

    def varargs(a, *rest, k=1, **more):
        pass

    calls = [((1, 2), {}), ((1,), {"b": 2}), ((), {"a": 1, "b": 2, "D": 9}), ((1, 2, 3, 4), {}),
             ((1, 2), {"D": 0, "c": 1}), ((1, 2, 3, 4, 5), {}), ((1,), {}), ((1, 2), {"a": 1}),
             ((1, 2), {"zz": 1}), ((), {})]
    for fn in (kernel, varargs):
        assert fake.getfullargspec(fn) == inspect.getfullargspec(fn)
        for args, kwargs in calls:
            try:
                want = inspect.getcallargs(fn, *args, **kwargs)
            except TypeError as error:
                with pytest.raises(TypeError, match=str(error).replace("(", r"\(").replace(")", r"\)")):
                    fake.getcallargs(fn, *args, **kwargs)
                continue
            got = fake.getcallargs(fn, *args, **kwargs)
            assert got == want and list(got) == list(want), (fn, args, kwargs)
    kernel.__defaults__ = (7, 8)  # a changed function is specced afresh
    assert fake.getcallargs(kernel, 1, 2) == {"a": 1, "b": 2, "c": 7, "D": 8}
    assert fake.ismodule(inspect) and fake.getmembers is inspect.getmembers  # everything else forwarded


def test_fast_unwrap_constexpr_matches_tritons(monkeypatch):
    core = tl.core
    monkeypatch.setattr(core, "_unwrap_if_constexpr", _original(core._unwrap_if_constexpr))
    original = core._unwrap_if_constexpr
    assert speed.fast_unwrap_constexpr() is True
    fast = core._unwrap_if_constexpr
    handle = core.tensor.__new__(core.tensor)
    values = [3, True, 2.5, "s", None, handle, core.constexpr(7), core.constexpr(core.constexpr(1)),
              [core.constexpr(1), 2], (core.constexpr(1), 2), core.tuple([core.constexpr(4), 5]), tl.int32]
    for value in values:
        want, got = original(value), fast(value)
        assert type(got) is type(want)
        assert speed._state(got) == speed._state(want), value


def test_lean_block_type_matches_tritons(monkeypatch):
    core = tl.core
    monkeypatch.setattr(core.block_type, "__init__", _original(core.block_type.__init__))
    original = core.block_type.__init__
    assert speed.lean_block_type() is True
    lean = core.block_type.__init__
    shapes = [[4], [2, 8], core.tuple([16, 1]), [core.constexpr(4), 2], core.tuple([core.constexpr(2)]),
              [], [3], [True], [2.0], (4,), [2 ** 40]]
    for element in (tl.int32, tl.float16, tl.pointer_type(tl.int64)):
        for shape in shapes:
            results = []
            for init in (original, lean):
                made = core.block_type.__new__(core.block_type)
                try:
                    init(made, element, shape)
                except Exception as error:  # the same error, from the same check
                    results.append((type(error).__name__, str(error)))
                else:
                    results.append((list(vars(made)), speed._state(made), str(made)))
            assert results[0] == results[1], (element, shape)


# ------------------------------------------------------------ each patch can refuse
@pytest.mark.parametrize("patch, owner, name", [
    (speed.memoise_np_dtype, "interpreter", "_get_np_dtype"),
    (speed.lean_builtin_calls, "interpreter", "_patch_attr"),
    (speed.cache_launch_binding, "interpreter", "inspect"),
    (speed.fast_unwrap_constexpr, "core", "_unwrap_if_constexpr"),
])
def test_a_patch_leaves_a_foreign_layout_alone(monkeypatch, patch, owner, name):
    target = interpreter if owner == "interpreter" else tl.core
    monkeypatch.delattr(target, name)
    assert patch() is False
    assert not hasattr(target, name)


def test_installed_twice_is_installed_once(monkeypatch):
    for owner, name in ((interpreter, "_get_np_dtype"), (interpreter, "_patch_attr"), (interpreter, "inspect"),
                        (tl.core, "_unwrap_if_constexpr"), (tl.core.block_type, "__init__")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    speed.install_all()
    assert not any(speed.install_all().values())


# ------------------------------------------------------------ installed in CPU mode
@pytest.mark.vllm
def test_cpu_mode_installs_every_patch(vllm_api):
    from simrig.vllm_runtime import platform

    if not platform.configure().is_cpu:
        pytest.skip("CUDA mode: no interpreter")
    platform.apply_after_import()  # called again (the scheduler's import and the runner's both call it)
    assert interpreter._get_np_dtype.__simrig_memo__
    assert interpreter._patch_attr.__simrig_lean__
    assert isinstance(interpreter.inspect, speed._Inspect)
    assert tl.core._unwrap_if_constexpr.__simrig_fast__
    assert tl.core.block_type.__init__.__simrig_original__.__simrig_lean__
    assert tl.core.block_type.__new__.__simrig_interned__  # interpreter_types
    assert tl.core.tensor.__init__.__simrig_lean__
    from triton.language import semantic

    assert semantic.TritonSemantic.binary_op_type_checking_impl.__simrig_fast__
    # interpreter_launch
    assert interpreter.GridExecutor._init_args_hst.__simrig_in_place__
    assert tl.str_to_ty.__simrig_memo__
    assert interpreter.interpreter_semantic.broadcast_impl_value.__simrig_fast__
    # the language was patched through the lean wrapper: tl.load calls Triton's load directly
    assert tl.load.__qualname__.startswith("lean_builtin_calls")


# ------------------------------------------------------------ MRV2 kernels: the same results
def _probe(speedups: str) -> dict:
    env = {**os.environ, "SIMRIG_INTERPRETER_SPEEDUPS": speedups, "PYTHONPATH": str(REPO)}
    env.pop("SIMRIG_DEVICE", None)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "interp_probe.py"),
                           *sorted(str(p) for p in SAMPLES.glob("*.jsonl"))],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
@pytest.mark.slow
def test_mrv2_kernels_leave_the_same_results_with_and_without_the_patches():
    """Every sample trace replayed twice, once with Triton's own interpreter
    plumbing: every kernel launch leaves the same bytes in every argument
    (tables of data pointers aside; every fresh allocation zero-filled in both, so lanes a
    kernel leaves unwritten agree), and the steps and findings agree."""
    plain, fast = _probe("0"), _probe("1")
    assert not any(plain["speedups"].values()) and all(fast["speedups"].values())
    kernels = {name for name, _, _ in plain["launches"]}
    assert {"_compute_slot_mappings_kernel", "_gather_block_tables_kernel", "_apply_write_kernel"} <= kernels
    assert len(plain["launches"]) == len(fast["launches"]) > 100
    for at, (a, b) in enumerate(zip(plain["launches"], fast["launches"])):
        assert a == b, (at, a[0])
    assert plain["steps"] == fast["steps"]
    assert plain["findings"] == fast["findings"]
