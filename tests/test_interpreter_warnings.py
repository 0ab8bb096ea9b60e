"""numpy's "invalid value encountered in divide" from Triton's interpreter: silent for the
0/0 lanes a ``tl.where`` discards (vLLM's block-verification ``_rejection_kernel`` makes one
on every spec-decode step with the stand-in logits), still raised for a lane a kernel keeps
(simrig/triton_interpreter/interpreter.py, ``quiet_discarded_nans``)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("no Triton", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
NUM, DEN = [0.0, 1.0, 0.0, 6.0], [0.0, 2.0, 0.0, 3.0]  # lanes 0 and 2: 0/0
kernels = interpreter = torch = None  # set by _triton, once the platform is chosen


@pytest.fixture(autouse=True, scope="module")
def _triton():
    global kernels, interpreter, torch
    from simrig.vllm_runtime import platform

    platform.configure()
    import torch as torch_module
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    @triton.jit
    def guarded(num, den, out, N: tl.constexpr):  # the block form: one program, N lanes
        offs = tl.arange(0, N)
        n, d = tl.load(num + offs), tl.load(den + offs)
        tl.store(out + offs, tl.where(d > 0.0, n / d, 1.0))

    @triton.jit
    def guarded_scalar(num, den, out):  # _rejection_kernel's form: one program per value
        i = tl.program_id(0)
        n, d = tl.load(num + i), tl.load(den + i)
        tl.store(out + i, tl.where(d > 0.0, n / d, 1.0))

    @triton.jit
    def unguarded(num, den, out, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(out + offs, tl.load(num + offs) / tl.load(den + offs))

    @triton.jit
    def badly_guarded(num, den, out, N: tl.constexpr):  # its tl.where keeps a 0/0 lane
        offs = tl.arange(0, N)
        n, d = tl.load(num + offs), tl.load(den + offs)
        tl.store(out + offs, tl.where(offs != 2, n / d, 1.0))

    kernels = {"guarded": guarded, "guarded_scalar": guarded_scalar, "unguarded": unguarded,
               "badly_guarded": badly_guarded}
    interpreter, torch = triton_interpreter, torch_module


@pytest.fixture
def tritons_own(monkeypatch):
    """Triton's own division and select (the class's methods) and the launch as it stands;
    all as they were after the test."""
    builder, executor = interpreter.interpreter_builder, interpreter.GridExecutor
    saved = {name: vars(builder).pop(name) for name in ("create_fdiv", "create_select") if name in vars(builder)}
    monkeypatch.setattr(executor, "__call__", executor.__call__)
    yield
    for name in ("create_fdiv", "create_select"):
        vars(builder).pop(name, None)
    vars(builder).update(saved)


@pytest.fixture
def quiet(tritons_own):
    from simrig.triton_interpreter.interpreter import quiet_discarded_nans

    assert quiet_discarded_nans() is True
    assert quiet_discarded_nans() is False  # installed once


def _run(name: str) -> tuple[list[float], list[warnings.WarningMessage]]:
    num, den = torch.tensor(NUM), torch.tensor(DEN)
    out = torch.full((4,), -1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if name == "guarded_scalar":
            kernels[name][(4,)](num, den, out)
        else:
            kernels[name][(1,)](num, den, out, N=4)
    return out.tolist(), [w for w in caught if issubclass(w.category, RuntimeWarning)]


def _nan_to_str(values: list[float]) -> list:
    return ["nan" if v != v else v for v in values]


def test_tritons_own_interpreter_warns_for_lanes_a_where_discards(tritons_own):
    values, caught = _run("guarded")
    assert values == [1.0, 0.5, 1.0, 2.0]
    assert [str(w.message) for w in caught] == ["invalid value encountered in divide"]


@pytest.mark.parametrize("name", ["guarded", "guarded_scalar"])
def test_lanes_a_where_discards_stay_silent(quiet, name):
    values, caught = _run(name)
    assert values == [1.0, 0.5, 1.0, 2.0]
    assert caught == []


@pytest.mark.parametrize("name, want", [("unguarded", ["nan", 0.5, "nan", 2.0]),
                                        ("badly_guarded", ["nan", 0.5, 1.0, 2.0])])
def test_a_lane_the_kernel_keeps_still_warns_at_its_line(quiet, name, want):
    values, caught = _run(name)
    assert _nan_to_str(values) == want
    assert [str(w.message) for w in caught] == ["invalid value encountered in divide"]
    assert Path(caught[0].filename) == Path(__file__)  # the kernel's line, not the interpreter's
    line = Path(__file__).read_text().splitlines()[caught[0].lineno - 1]
    assert " / " in line


def test_a_division_a_failed_launch_left_held_is_dropped(quiet):
    import numpy as np
    import triton.language as tl

    from simrig.triton_interpreter import interpreter as interp

    zero = interpreter.TensorHandle(np.zeros(2, np.float32), tl.float32)
    interpreter.interpreter_builder.create_fdiv(zero, zero)  # held, as when a launch raises after it
    assert len(interp._held) == 1
    values, caught = _run("guarded")
    assert values == [1.0, 0.5, 1.0, 2.0] and caught == [] and interp._held == {}


# ------------------------------------------------------------ a replay that made them
@pytest.mark.vllm
def test_replaying_block_verification_emits_no_runtime_warning(vllm_api, tmp_path, monkeypatch):
    """``traces/samples/spec_decode.jsonl`` under vLLM's block-verification rejection
    sampler: ``denom`` is 0 (so ``residual_mass / denom`` is 0/0, in a lane ``tl.where``
    discards) for each request whose first draft and the next are both the trace's tokens
    (the stand-in logits give them all the target's mass): b at step 1, a at step 3, a and c
    at step 4. numpy warned for each before."""
    from strategies.configs import vllm_samplers_run_here

    if not vllm_samplers_run_here():
        pytest.skip("this vLLM's samplers do not run in Triton's CPU interpreter")
    from simrig.replay import replay_traces
    from simrig.triton_interpreter import registry

    assert {s.name: s for s in registry.patch_states()}["quiet_discarded_nans"].state == registry.INSTALLED, [s for s in registry.patch_states() if s.state != "installed"]
    lines = (REPO / "traces" / "samples" / "spec_decode.jsonl").read_text().splitlines()
    lines[0] = lines[0].replace('"num_speculative_tokens":2', '"num_speculative_tokens":2,"rejection_sampler":"block"')
    assert '"rejection_sampler":"block"' in lines[0]
    trace = tmp_path / "spec_block.jsonl"
    trace.write_text("\n".join(lines) + "\n")

    builder = interpreter.interpreter_builder
    divide, zero_by_zero = builder.create_fdiv, []

    def counting(lhs, rhs):
        zero_by_zero.append(int(((lhs.data == 0) & (rhs.data == 0)).sum()))
        return divide(lhs, rhs)

    monkeypatch.setattr(builder, "create_fdiv", counting)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = replay_traces([trace])
    assert sum(zero_by_zero) == 4  # the case is reached, once per such request
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert result.num_steps == 6  # the trace's six steps, each replayed
