"""`simrig doctor` and the adapter's drift detection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simrig.adapters.runner import EntryPoint, VllmApiError, _resolve


def _simrig(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simrig", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=300)


@pytest.mark.vllm
def test_doctor_passes_here():
    proc = _simrig(["doctor"])
    assert proc.returncode == 0, proc.stderr
    assert "vllm     0.33.0" in proc.stdout or "vllm " in proc.stdout
    assert "all entry points usable" in proc.stdout
    assert proc.stdout.count("ok  ") >= 15
    if "(cpu-interpreter)" in proc.stdout:  # each interpreter patch and its state
        assert "interpreter patches (Triton " in proc.stdout and "17 installed, 0 skipped, 0 failed" in proc.stdout
        assert "  installed sample_traced_launches" in proc.stdout


def test_doctor_without_vllm_exits_2_with_one_line(tmp_path: Path):
    fake = tmp_path / "vllm"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('simulated: vllm is broken here')\n")
    proc = _simrig(["doctor"], env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1
    assert "vllm is not importable" in error_lines[0]


@pytest.mark.vllm
def test_drift_names_module_attribute_and_version(vllm_api):
    missing = EntryPoint("vllm.v1.worker.gpu.input_batch", "InputBatch.make_dummy_v9")
    with pytest.raises(VllmApiError) as info:
        _resolve(missing, vllm_api.version)
    text = str(info.value)
    assert "vllm.v1.worker.gpu.input_batch.InputBatch.make_dummy_v9" in text
    assert vllm_api.version in text


@pytest.mark.vllm
def test_drift_in_signature_is_named(vllm_api):
    changed = EntryPoint("vllm.v1.worker.gpu.input_batch", "InputBatch.make_dummy",
                         ("num_reqs", "num_tokens", "input_buffers", "num_loras"))
    with pytest.raises(VllmApiError, match="lacks parameter.*num_loras"):
        _resolve(changed, vllm_api.version)


@pytest.mark.vllm
def test_api_drift_ends_a_replay_with_one_line_and_exit_2(vllm_api, monkeypatch, capsys, tmp_path):
    import simrig.adapters.runner as adapter
    from simrig.cli import main

    drifted = adapter.ENTRY_POINTS + (
        EntryPoint("vllm.v1.worker.gpu.pcp_manager", "PCPManager.partition_batch_v2"),)
    monkeypatch.setattr(adapter, "ENTRY_POINTS", drifted)
    monkeypatch.setattr(adapter, "_api", None)  # force a fresh check of the install
    sample = Path(__file__).resolve().parents[1] / "traces" / "samples" / "chunked_prefill.jsonl"
    status = main(["replay", "--no-coverage", str(sample), "--out", str(tmp_path / "rep"), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1
    assert f"vLLM {vllm_api.version}: vllm.v1.worker.gpu.pcp_manager.PCPManager.partition_batch_v2" in err
    assert not (tmp_path / "rep").exists()
