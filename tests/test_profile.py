"""``simrig fuzz --profile``: the stack sampler files each sample under vLLM,
Hypothesis or the rig, and a campaign writes its split next to the report."""

from __future__ import annotations

import json

import pytest

from simrig.cli import main
from simrig.report.profile import StackSampler, _owner_of_file

SITE = "/home/u/simrig/.venv/lib/python3.11/site-packages"


@pytest.mark.parametrize("path, owner", [
    (f"{SITE}/vllm/v1/worker/gpu/model_runner.py", "vllm"),
    (f"{SITE}/hypothesis/core.py", "hypothesis"),  # a checkout named simrig is not the rig
    (f"{SITE}/triton/runtime/interpreter.py", None),  # below a vLLM frame: vLLM's
    ("/home/u/simrig/simrig/harness.py", "rig"),
    ("/home/u/simrig/strategies/machine.py", "rig"),
    ("<frozen runpy>", None),
])
def test_each_frame_belongs_to_its_package(path, owner):
    assert _owner_of_file(path) == owner


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        StackSampler(interval_s=0)


@pytest.mark.vllm
def test_the_sampler_gets_the_gil_soon_after_each_wake_up_and_gives_the_setting_back():
    """Python's 5 ms switch interval would let the sampler read stacks mostly inside
    GIL-releasing calls; while sampling it is a tenth of the interval, then as before."""
    import sys

    before = sys.getswitchinterval()
    sampler = StackSampler(interval_s=0.004).start()
    try:
        assert sys.getswitchinterval() == pytest.approx(min(before, 0.0004))
    finally:
        sampler.stop()
    assert sys.getswitchinterval() == before


def test_a_profiled_campaign_writes_its_split(tmp_path, capsys):
    out = tmp_path / "fuzz"
    status = main(["fuzz", "--no-coverage", "--max-examples", "3", "--seed", "1", "--database", "none",
                   "--no-regressions", "--pcp-sizes", "1", "--cudagraph-modes", "NONE",
                   "--profile", "--quiet", "--out", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    profile = json.loads((out / "profile" / "summary.json").read_text())
    assert profile["samples"] > 0
    assert abs(sum(profile["shares"].values()) - 1) < 0.01
    assert profile["shares"]["vllm"] > 0.3  # the campaign runs the real execute_model
    assert profile["top"]["vllm"] and all("(vllm/" in name for name, _ in profile["top"]["vllm"])
    lines = (out / "profile" / "stacks.collapsed").read_text().splitlines()
    assert lines and all(line.rsplit(" ", 1)[1].isdigit() for line in lines)
    assert "profile: vllm" in printed and "profile.txt" in printed


def test_a_kernel_launch_through_the_coverage_hook_stays_vllms():
    """The sampler's pass-through frames (simrig/triton_interpreter/interpreter.py, trace_gate.launch)
    between a vLLM caller and Triton's interpreter do not make the launch the rig's."""
    from types import SimpleNamespace

    def frame(filename: str, qualname: str, back=None):
        return SimpleNamespace(f_code=SimpleNamespace(co_filename=filename, co_qualname=qualname,
                                                      co_name=qualname.rsplit(".", 1)[-1]), f_back=back)

    caller = frame(f"{SITE}/vllm/v1/worker/gpu/block_table.py", "BlockTables.gather_block_tables")
    hook = frame("/home/u/simrig/simrig/triton_interpreter/interpreter.py", "sample_traced_launches.<locals>.launch",
                 caller)
    gate = frame("/home/u/simrig/simrig/trace_gate.py", "launch", hook)
    leaf = frame(f"{SITE}/triton/runtime/interpreter.py", "GridExecutor.__call__", gate)
    assert StackSampler._sample(leaf)[0] == "vllm"
    # a stand-in for Triton's own plumbing (interpreter_speed) inside the launch is vLLM's too
    stand_in = frame("/home/u/simrig/simrig/triton_interpreter/interpreter_speed.py",
                     "lean_builtin_calls.<locals>._patch_attr.<locals>.new_member", leaf)
    assert StackSampler._sample(frame(f"{SITE}/triton/language/semantic.py", "add", stand_in))[0] == "vllm"
    kept = frame("/home/u/simrig/simrig/triton_interpreter/interpreter_types.py", "lean_tensors.<locals>.__init__", leaf)
    assert StackSampler._sample(kept)[0] == "vllm"
    probe = frame("/home/u/simrig/simrig/stage_probes.py", "Probes._attn_probe", caller)
    assert StackSampler._sample(frame(f"{SITE}/numpy/core.py", "f", probe))[0] == "rig"
