"""The adapter against a second installed vLLM release (a side venv).

``SIMRIG_SIDE_VENV`` names the side venv (``.ci/run`` builds one and sets it).
Without it these tests are skipped, and say so; with it set, a missing or
broken side venv fails them: CI never passes them silently.

Each test runs simrig *inside* the side venv (its own interpreter, its own
vLLM) and checks the outcome against what that release is known to do
(/work/shared/VLLM_VERSIONS.md and reports/baselines/known-findings.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIDE = os.environ.get("SIMRIG_SIDE_VENV", "")

pytestmark = pytest.mark.skipif(not SIDE, reason="SIMRIG_SIDE_VENV not set (.ci/run sets it)")

# release -> PCP decode sharding available (PCPManager(shard_decode_requests), from 0.32)
RELEASES = {
    "0.30.0": False,
    "0.31.0": False,
    "0.32.0": True,
    "0.33.0": True,
}


def _side(args: list[str]) -> subprocess.CompletedProcess:
    python = Path(SIDE) / "bin" / "python"
    assert python.exists(), f"SIMRIG_SIDE_VENV={SIDE}: no bin/python (run simrig env create)"
    return subprocess.run([str(python), "-m", "simrig", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def _installed_version() -> str:
    from simrig.findings.known import installed_vllm_version

    return installed_vllm_version()


def test_doctor_on_the_side_release():
    proc = _side(["doctor"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    version = next(ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("vllm "))
    assert version != _installed_version(), "the side venv must hold another release"
    assert version in RELEASES, f"side release {version} is not one the adapter is tested on"
    shards = RELEASES[version]
    assert ("unavailable on this vLLM: partition (pcp_shard_decode_requests)" in proc.stdout) is not shards


def test_replay_on_the_side_release_has_only_known_findings(tmp_path):
    out = tmp_path / "report"
    proc = _side(["replay", "--no-coverage", "traces/samples", "--out", str(out), "--quiet"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["vllm_version"] in RELEASES and summary["new"] == 0
    assert summary["known"] > 0  # the logits_indices discrepancy exists in every release
    shards = RELEASES[summary["vllm_version"]]
    assert bool(summary["unavailable"]) is not shards
    if not shards:
        assert {u["trace"].rsplit("/", 1)[-1] for u in summary["unavailable"]} == {"pcp4_shard_decode.jsonl"}


def test_compare_side_against_installed(tmp_path):
    """One short side-by-side run (a warm-up and one timed round a side: no verdict is asked):
    both sides report, the dummy logits_indices class is shared."""
    out = tmp_path / "cmp"
    proc = subprocess.run([sys.executable, "-m", "simrig", "compare", "--vllm", SIDE, "--vllm",
                           "installed", "traces/samples/spec_decode.jsonl", "--rounds", "2",
                           "--stages", "gather,prepare,dummy", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["a"]["vllm_version"] != summary["b"]["vllm_version"] == _installed_version()
    sides = (out / "class_sides.csv").read_text()
    assert "dtype_drift,dummy,logits_indices,parity" in sides
    assert summary["classes"]["new"] == summary["class_sides"]["B only"]
    assert set(summary["latency"]) >= {"gather", "prepare", "dummy"}
    assert summary["exit_status"] == proc.returncode


def test_rows_a_larger_batch_left_show_before_0_33(tmp_path):
    """The shrunk 0.32.0 campaign trace (a larger batch, then a smaller one with no idle dummy
    between): before 0.33.0 the rows the larger batch gathered stay in the shared table past the
    smaller batch's (known, #40); the release that clears them shows nothing (the installed one,
    tests/test_known_signatures.py)."""
    out = tmp_path / "report"
    proc = _side(["replay", "tests/fixtures/stale_rows_after_larger_batch.jsonl", "--out", str(out),
                  "--quiet", "--no-coverage"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    import pandas as pd

    findings = pd.read_csv(out / "findings.csv")
    past = findings[findings["field"].astype(str).str.startswith("attn.filled_rows_past")]
    if summary["vllm_version"] in ("0.30.0", "0.31.0", "0.32.0"):
        assert len(past) and set(past["verdict"]) == {"known"} and "prepare" in set(past["stage"])
    else:
        assert past.empty
