"""The multi-node path on one machine: a head and a second node (`ray start`,
one CPU each) and a campaign against them with --ray."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
pytestmark = [pytest.mark.vllm, pytest.mark.cluster]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`ray start ... --block` in its own process group (stopped by group, never `ray stop`,
    which would stop every Ray on the machine)."""
    proc = subprocess.Popen([RAY, "start", "--block", "--num-cpus", "1", "--disable-usage-stats",
                             *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the group, then SIGKILL to whatever of it is left (gcs_server outlives
    `ray start --block` at times; a graceful stop took up to 15 s a node, so it gets 3)."""
    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)


@pytest.fixture
def two_nodes(tmp_path):
    env = dict(os.environ, RAY_AUTH_MODE="token")
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    head = _ray_start(["--head", "--port", str(port), "--include-dashboard=false"], env,
                      tmp_path / "head.log")
    try:
        node = _ray_start(["--address", f"127.0.0.1:{port}"], env, tmp_path / "node.log")
        try:
            yield f"127.0.0.1:{port}", env
        finally:
            _stop(node)
    finally:
        _stop(head)


def test_campaign_on_a_two_node_cluster(tmp_path, two_nodes):
    address, env = two_nodes
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "simrig", "fuzz", "--ray", address, "--workers", "2", "--budget", "3",
         "--pcp-sizes", "1", "--stages", "gather", "--database", "none", "--no-regressions",
         "--progress", "quiet", "--no-coverage", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ray"]["nodes"] == 2 and summary["ray"]["cluster_cpus"] == 2
    shards = pd.read_csv(out / "shards.csv")
    assert shards.status.tolist() == ["done", "done"] and (shards.steps > 0).all()
    nodes = {w.rsplit("/", 1)[1] for w in shards.worker}
    assert len(nodes) == 2, shards.worker.tolist()  # one shard on each node
