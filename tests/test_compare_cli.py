"""``simrig compare`` / ``simrig env`` on bad input: one line, exit 2, no report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _simrig(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simrig", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **env}, timeout=300)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("spec, says", [
    ("banana", "not a release"),
    ("0.20.0", "no Model Runner V2"),
    ("0.30.7", "no side venv"),  # a release never built here
])
def test_bad_vllm_spec(tmp_path, spec, says):
    out = tmp_path / "report"
    line = _one_error_line(_simrig(["compare", "--vllm", spec, "--vllm", "installed",
                                    "traces/samples/pcp2.jsonl", "--out", str(out)],
                                   SIMRIG_VENVS=str(tmp_path / "venvs")))
    assert says in line and spec in line
    assert not out.exists()


def test_env_create_refuses_a_release_without_mrv2(tmp_path):
    line = _one_error_line(_simrig(["env", "create", "--vllm", "0.29.0"],
                                   SIMRIG_VENVS=str(tmp_path / "venvs")))
    assert "0.29.0" in line and "no Model Runner V2" in line
    assert not (tmp_path / "venvs").exists()


def test_a_side_whose_vllm_does_not_import(tmp_path):
    """A venv whose interpreter sees simrig but a vLLM that fails at import."""
    broken = tmp_path / "broken-vllm"
    (broken / "vllm").mkdir(parents=True)
    (broken / "vllm" / "__init__.py").write_text("raise ImportError('simulated: broken build')\n")
    venv = tmp_path / "side"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={broken} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    out = tmp_path / "report"
    line = _one_error_line(_simrig(["compare", "--vllm", str(venv), "--vllm", "installed",
                                    "traces/samples/pcp2.jsonl", "--out", str(out)]))
    assert str(venv) in line and "unusable" in line and "not importable" in line
    assert not out.exists()


def test_compare_needs_two_sides(tmp_path):
    line = _one_error_line(_simrig(["compare", "--vllm", "installed", "traces/samples"]))
    assert "exactly two" in line
