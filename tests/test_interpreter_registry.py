"""simrig/triton_interpreter/registry.py: every interpreter patch goes in through
the registry, only where its probe agrees with Triton's own answer and on a
Triton it is known good on; a patch that fails is put back whole; the states
reach ``simrig doctor`` and every report's summary."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from simrig.triton_interpreter import registry
from simrig.triton_interpreter.registry import FAILED, INSTALLED, SKIPPED, Patch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh(monkeypatch):
    """The registry's books empty for the test, as they were after it (the
    patches this process installed stay installed), and a module to patch."""
    monkeypatch.setattr(registry, "_states", {})
    monkeypatch.setattr(registry, "_installed", [])
    monkeypatch.setattr(registry, "_answers", {})
    monkeypatch.setattr(registry, "triton_version", lambda: "1.0")
    monkeypatch.delenv(registry.SPEEDUPS_ENV, raising=False)
    monkeypatch.delenv(registry.PATCHES_ENV, raising=False)
    module = types.ModuleType("fake_triton_runtime")

    class Executor:
        def launch(self, x):
            return x * 2

    module.Executor, module.scale = Executor, 3
    module.compute = lambda x: x * module.scale
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _patch(module, name="faster", install=None, probe=None, **kw) -> Patch:
    def plain_install() -> bool:  # the same answers with a different function
        module.compute = lambda x: module.scale * x
        return True

    return Patch(name, module.__name__, ("compute",), install or plain_install,
                 probe or (lambda: [module.compute(x) for x in range(-3, 4)]), kw.pop("known_good", ("1.0",)), **kw)


def test_a_patch_whose_probe_agrees_is_installed_and_recorded(fresh):
    original = fresh.compute
    state = registry.apply(_patch(fresh))
    assert state.state == INSTALLED and state.reason == ""
    assert fresh.compute is not original
    assert [s.name for s in registry.patch_states()] == ["faster"]
    assert registry.summary()["line"] == "1 installed, 0 skipped, 0 failed"
    assert registry.apply(_patch(fresh)).state == INSTALLED  # applied twice: installed once
    assert len(registry._installed) == 1


def test_a_probe_that_disagrees_fails_the_patch_and_puts_every_target_back(fresh):
    original_launch = fresh.Executor.launch

    def wrong() -> bool:
        fresh.compute = lambda x: x * fresh.scale + (x == 2)
        fresh.Executor.launch = lambda self, x: x  # a second target, half of the work
        return True

    patch = Patch("wrong", fresh.__name__, ("compute", "Executor.launch"), wrong,
                  lambda: [fresh.compute(x) for x in range(4)] + [fresh.Executor().launch(5)], ("1.0",))
    original = fresh.compute
    state = registry.apply(patch)
    assert state.state == FAILED
    assert "probe disagreed with Triton's own answer" in state.reason and "[2]: 6 != 7" in state.reason
    assert fresh.compute is original and fresh.Executor.launch is original_launch


def test_a_half_applied_patch_whose_layout_check_refuses_is_put_back(fresh):
    instance = fresh.Executor()

    def half() -> bool:
        instance.launch = lambda x: x  # an instance attribute over the class's method
        fresh.scale = 4
        return False

    patch = Patch("half", fresh.__name__, ("scale", "instance.launch"), half, lambda: fresh.scale, ("1.0",))
    fresh.instance = instance
    state = registry.apply(patch)
    assert state.state == FAILED and state.reason == "its layout check refused this Triton"
    assert fresh.scale == 3 and "launch" not in vars(instance)


def test_an_inherited_attribute_shows_through_again(fresh):
    instance = fresh.Executor()
    fresh.instance = instance

    def shadow() -> bool:
        instance.launch = lambda x: -x
        return True

    state = registry.apply(Patch("shadow", fresh.__name__, ("instance.launch",), shadow,
                                 lambda: instance.launch(2), ("1.0",)))
    assert state.state == FAILED and "4 != -2" in state.reason
    assert "launch" not in vars(instance) and instance.launch(2) == 4


def test_a_missing_target_fails_without_touching_anything(fresh):
    called = []
    patch = Patch("elsewhere", fresh.__name__, ("Executor.gone",), lambda: called.append(1) or True,
                  lambda: 0, ("1.0",))
    state = registry.apply(patch)
    assert state.state == FAILED and state.reason == f"target missing: {fresh.__name__}.Executor.gone"
    assert called == []


def test_a_probe_that_raises_fails_the_patch(fresh):
    def breaks() -> bool:
        fresh.compute = None
        return True

    original = fresh.compute
    state = registry.apply(_patch(fresh, install=breaks))
    assert state.state == FAILED and "probe raised with the patch: TypeError" in state.reason
    assert fresh.compute is original


def test_speedups_off_skips_every_speed_patch_but_not_a_required_one(fresh, monkeypatch):
    monkeypatch.setenv(registry.SPEEDUPS_ENV, "0")
    speed = registry.apply(_patch(fresh))
    assert speed.state == SKIPPED and speed.reason.startswith(f"{registry.SPEEDUPS_ENV}=0")
    required = registry.apply(_patch(fresh, name="checker", required="asked for by the run"))
    assert required.state == INSTALLED


def test_a_patch_whose_need_is_not_installed_is_skipped(fresh, monkeypatch):
    monkeypatch.setenv(registry.SPEEDUPS_ENV, "0")
    registry.apply(_patch(fresh, name="first"))
    monkeypatch.delenv(registry.SPEEDUPS_ENV)
    state = registry.apply(_patch(fresh, name="second", needs=("first",)))
    assert state.state == SKIPPED and state.reason == "needs first, which is skipped"


def test_an_unknown_triton_keeps_patches_off_unless_forced(fresh, monkeypatch):
    monkeypatch.setattr(registry, "triton_version", lambda: "9.9.9")
    original = fresh.compute
    state = registry.apply(_patch(fresh))
    assert state.state == SKIPPED and "Triton 9.9.9 is not one it is known good on (1.0)" in state.reason
    assert f"{registry.PATCHES_ENV}=force" in state.reason and fresh.compute is original
    monkeypatch.setenv(registry.PATCHES_ENV, "force")
    assert registry.apply(_patch(fresh)).state == INSTALLED


def test_forced_start_up_check_that_differs_takes_every_patch_back(fresh, monkeypatch):
    monkeypatch.setattr(registry, "triton_version", lambda: "9.9.9")
    monkeypatch.setenv(registry.PATCHES_ENV, "force")
    original = fresh.compute

    def skew() -> bool:  # the probe cannot see it (it never calls launch)
        fresh.Executor.launch = lambda self, x: x * 2 + 1
        return True

    patches = [_patch(fresh), Patch("skew", fresh.__name__, ("Executor.launch",), skew, lambda: 0, ("1.0",))]
    states = registry.install_all(patches, startup_check=lambda: fresh.Executor().launch(4), check_name="kernel")
    assert [s.state for s in states] == [FAILED, FAILED]
    assert all(s.reason.startswith("kernel on Triton 9.9.9: output differs with the patches (answer: 8 != 9)")
               for s in states)
    assert fresh.compute is original and fresh.Executor().launch(4) == 8
    assert registry._installed == []


def test_forced_start_up_check_that_agrees_keeps_them(fresh, monkeypatch):
    monkeypatch.setattr(registry, "triton_version", lambda: "9.9.9")
    monkeypatch.setenv(registry.PATCHES_ENV, "force")
    runs = []
    states = registry.install_all([_patch(fresh)], startup_check=lambda: runs.append(1) or 8)
    assert [s.state for s in states] == [INSTALLED] and runs == [1, 1]


def test_a_known_triton_runs_no_start_up_check(fresh):
    runs = []
    registry.install_all([_patch(fresh)], startup_check=lambda: runs.append(1))
    assert runs == []


def test_the_report_summary_lists_the_states(fresh, tmp_path):
    import pandas as pd

    from simrig.report.writer import write_report

    registry.apply(_patch(fresh))
    registry.apply(_patch(fresh, name="elsewhere", known_good=("2.0",)))
    empty = pd.DataFrame()
    out = write_report(tmp_path / "rep", empty, pd.DataFrame({"kind": [], "verdict": []}), empty, {})
    summary = json.loads((out / "summary.json").read_text())["interpreter_patches"]
    assert summary["line"] == "1 installed, 1 skipped, 0 failed"
    assert [p["name"] for p in summary["patches"]] == ["faster", "elsewhere"]
    assert "interpreter patches: 1 installed, 1 skipped, 0 failed" in (out / "report.html").read_text()


# ------------------------------------------------------------ the real patches, on this Triton
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no Triton")


@needs_triton
@pytest.mark.vllm
def test_cpu_mode_installs_all_sixteen_and_libdevice_through_the_registry(vllm_api):
    from simrig.triton_interpreter import patch_catalogue
    from simrig.vllm_runtime import platform
    from simrig.vllm_runtime.interpreter_patches import libdevice_patch

    if not platform.configure().is_cpu:
        pytest.skip("CUDA mode: no interpreter")
    states = {s.name: s for s in registry.patch_states()}
    assert len(patch_catalogue.PATCHES) == 16
    assert all(states[p.name].state == INSTALLED for p in (*patch_catalogue.PATCHES, libdevice_patch())), "\n".join(
        [registry.summary()["line"]] + [s.line() for s in registry.patch_states() if s.state != INSTALLED])
    # SIMRIG_INTERPRETER_SPEEDUPS=0 turns each off but the three that are no speed-up
    assert [p.name for p in (*patch_catalogue.PATCHES, libdevice_patch()) if p.required] == [
        "range_yields_tensors", "quiet_discarded_nans", "answer_libdevice"]


@needs_triton
@pytest.mark.parametrize("name, target, broken", [
    ("memoise_np_dtype", "_get_np_dtype", lambda original: lambda t: original(tl_module().float64)),
    ("cache_launch_binding", "inspect", lambda original: _swapped_binding(original)),
    ("sample_traced_launches", "GridExecutor.__call__", lambda original: lambda self, *a, **k: None),
    ("skip_dead_overflow_checks", "interpreter_builder.options",
     lambda original: __import__("dataclasses").replace(original, debug=True)),
    ("lean_builtin_calls", "interpreter_builder.create_masked_store", lambda original: lambda *a, **k: None),
])
def test_each_probe_sees_a_broken_stand_in_and_puts_triton_back(fresh, name, target, broken):
    """The catalogue's own probe against a stand-in that gets one thing wrong
    (the four that once checked only that their targets exist among them)."""
    import dataclasses

    from simrig.triton_interpreter import patch_catalogue
    from simrig.vllm_runtime import platform

    platform.configure()
    from triton.runtime import interpreter

    owner_path, _, attr = target.rpartition(".")
    owner = interpreter
    for part in filter(None, owner_path.split(".")):
        owner = getattr(owner, part)
    before = getattr(owner, attr)

    def install() -> bool:
        setattr(owner, attr, broken(before))
        return True

    patch = dataclasses.replace(patch_catalogue.by_name(name), name=f"broken_{name}",
                                module=patch_catalogue.INTERP, attrs=(target,), install=install,
                                known_good=("1.0",), undo=None)
    state = registry.apply(patch)
    assert state.state == FAILED, state
    assert state.reason.startswith(("probe disagreed with Triton's own answer", "probe raised with the patch")), state
    assert getattr(owner, attr) == before  # (a bound method is made anew on each lookup)


def tl_module():
    import triton.language as tl

    return tl


def _swapped_binding(original):
    stand_in = types.ModuleType("inspect")
    stand_in.__getattr__ = lambda name: getattr(original, name)
    stand_in.getfullargspec = original.getfullargspec

    def getcallargs(fn, *args, **kwargs):
        bound = original.getcallargs(fn, *args, **kwargs)
        keys = list(bound)
        return dict(zip(keys, reversed(list(bound.values()))))

    stand_in.getcallargs = getcallargs
    return stand_in


# ------------------------------------------------------------ an unknown Triton, end to end
def _unknown(scenario: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("SIMRIG_DEVICE", registry.PATCHES_ENV, registry.SPEEDUPS_ENV, "SIMRIG_MEMCHECK"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "interp_registry_probe.py"), scenario],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_triton
@pytest.mark.vllm
@pytest.mark.slow
def test_an_unknown_triton_keeps_the_patches_off_and_a_forced_mismatch_takes_them_back():
    """Triton reported as 9.9.9: without opting in, every patch is skipped and
    says why; forced, the start-up check (vLLM's slot-mapping kernel) passes
    and all install; forced with a patch that skews every store (its own
    probe blind to it), the check differs and every patch is taken back,
    leaving the kernel writing what Triton's own plumbing writes."""
    off = _unknown("unknown")
    assert off["summary"] == "0 installed, 17 skipped, 0 failed"
    assert all("Triton 9.9.9 is not one it is known good on" in reason for _, _, reason in off["states"])
    assert off["launch_is_tritons"] and off["same_as_plain"]
    forced = _unknown("force")
    assert forced["summary"] == "17 installed, 0 skipped, 0 failed" and forced["same_as_plain"]
    fault = _unknown("fault")
    assert fault["summary"] == "0 installed, 0 skipped, 18 failed"
    assert all(reason.startswith("start-up check (_compute_slot_mappings_kernel) on Triton 9.9.9: output differs")
               for _, _, reason in fault["states"])
    assert fault["same_as_plain"] and fault["store_put_back"] and fault["launch_is_tritons"]
    assert fault["np_dtype_is_tritons"]


def test_a_second_install_keeps_the_failures_and_runs_no_second_check(fresh, monkeypatch):
    """apply_after_import runs twice per process (the scheduler's import and the runner's)."""
    monkeypatch.setattr(registry, "triton_version", lambda: "9.9.9")
    monkeypatch.setenv(registry.PATCHES_ENV, "force")
    runs = []
    answers = iter([1, 2])
    check = lambda: runs.append(1) or next(answers, 3)  # noqa: E731
    first = registry.install_all([_patch(fresh)], startup_check=check)
    again = registry.install_all([_patch(fresh)], startup_check=check)
    assert [s.state for s in first] == [s.state for s in again] == [FAILED] and runs == [1, 1]
