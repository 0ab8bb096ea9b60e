"""simrig bisect over releases and simrig repro's standalone files against a second release.

``SIMRIG_SIDE_VENV`` names the side venv, as for tests/test_releases.py (``.ci/run`` builds
0.31.0); without it these tests are skipped and say so. The facts checked are vLLM's own
(README, *Known findings*): the device ``idx_mapping`` is int32 only in 0.31.0; the dummy
batch's ``logits_indices`` is int32 against the real batch's int64 in 0.30.0-0.33.0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simrig.bisect.points import vllm_version_of
from simrig.repro.pytest_file import run_pytest

ROOT = Path(__file__).resolve().parents[1]
SIDE = os.environ.get("SIMRIG_SIDE_VENV", "")
TRACE = ROOT / "traces" / "samples" / "chunked_prefill.jsonl"

pytestmark = [pytest.mark.skipif(not SIDE, reason="SIMRIG_SIDE_VENV not set (.ci/run sets it)"),
              pytest.mark.vllm, pytest.mark.slow]


def _side_python() -> str:
    python = Path(SIDE) / "bin" / "python"
    assert python.exists(), f"SIMRIG_SIDE_VENV={SIDE}: no bin/python (run simrig env create)"
    return str(python)


def _simrig(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simrig", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "SIMRIG_HISTORY": "none", **env}, timeout=1200)


def _repro(tmp_path: Path, cls: str) -> Path:
    out = tmp_path / f"test_{cls.replace(':', '_')}.py"
    proc = _simrig(["repro", str(TRACE), "--class", cls, "--pytest", str(out)])
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_dummy_logits_indices_file_fails_on_both_releases(tmp_path):
    file = _repro(tmp_path, "dtype_drift:dummy:logits_indices")
    for python in (sys.executable, _side_python()):
        status, tail = run_pytest(python, file)
        assert status == 1, tail
        assert ("_dummy_run: InputBatch.logits_indices is torch.int32, the real batch's "
                "(execute_model) is torch.int64") in tail


def test_idx_mapping_bisects_to_0_31_0_and_its_file_fails_only_there(tmp_path):
    side = vllm_version_of(_side_python())
    if side != "0.31.0":
        pytest.skip(f"the int32 idx_mapping class is 0.31.0's; the side venv holds {side}")
    file = _repro(tmp_path, "dtype_drift:prepare:idx_mapping")
    status, tail = run_pytest(_side_python(), file)
    assert status == 1 and "execute_model: InputBatch.idx_mapping is torch.int32, expected torch.int64" in tail
    status, tail = run_pytest(sys.executable, file)
    assert status == 0, tail
    venvs = tmp_path / "venvs"  # only the side venv: the range holds no release in between
    venvs.mkdir()
    out = tmp_path / "bisect"
    proc = _simrig(["bisect", str(TRACE), "--class", "dtype_drift:prepare:idx_mapping",
                    "--good", "installed", "--bad", SIDE, "--cache", str(tmp_path / "cache"),
                    "--out", str(out), "--json"], SIMRIG_VENVS=str(venvs))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (leg,) = json.loads(proc.stdout)["legs"]
    assert (leg["direction"], leg["last_old"], leg["first_new"]) == ("fixed", "0.31.0",
                                                                      vllm_version_of(sys.executable))
    runner = [r for r in leg["changed_files"] if r["path"] == "vllm/v1/worker/gpu/model_runner.py"]
    assert runner and runner[0]["mentions_field"] > 0  # its changed lines mention idx_mapping
    assert "dtype=torch.int32" in (out / "leg-0.diff").read_text()
