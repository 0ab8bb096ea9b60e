"""The multi-node path on one machine: a campaign with --ray against the Ray tier's session
cluster, a head and a second node of one CPU each (tests/conftest.py: ``ray_cluster``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.vllm, pytest.mark.cluster]


def test_campaign_on_a_two_node_cluster(tmp_path, ray_cluster):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the address comes from --ray
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "simrig", "fuzz", "--ray", ray_cluster, "--workers", "2", "--budget", "3",
         "--pcp-sizes", "1", "--stages", "gather", "--database", "none", "--no-regressions",
         "--progress", "quiet", "--no-coverage", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ray"]["nodes"] == 2 and summary["ray"]["cluster_cpus"] == 2
    assert summary["ray"]["address"] == ray_cluster
    shards = pd.read_csv(out / "shards.csv")
    assert shards.status.tolist() == ["done", "done"] and (shards.steps > 0).all()
    nodes = {w.rsplit("/", 1)[1] for w in shards.worker}
    assert len(nodes) == 2, shards.worker.tolist()  # one shard on each node
