"""Shared fixtures: one adapter for the installed vLLM per test session."""

from __future__ import annotations

import os

import pytest

# SIMRIG_TEST_CPU=path: each test's CPU seconds, its own and its children's (tests/cpu_ledger.py)
pytest_plugins = ["tests.cpu_ledger"]

# `ray start` clusters (the Ray tier's session cluster, the two-node test) take token
# authentication; Ray reads the mode once, when it is first imported, so it is set before any
# test module imports it. The token lands in ~/.ray, where every client of the session reads it.
os.environ["RAY_AUTH_MODE"] = "token"


@pytest.fixture(scope="session")
def vllm_api():
    """The real installed vLLM, loaded once (the import costs ~15 s on CPU)."""
    from simrig.adapters.runner import load

    return load()


@pytest.fixture(scope="session", autouse=True)
def _history_in_tmp(tmp_path_factory):
    """Commands run by tests record their history in a temporary store, never in reports/."""
    import os

    old = os.environ.get("SIMRIG_HISTORY")
    os.environ["SIMRIG_HISTORY"] = str(tmp_path_factory.mktemp("history"))
    yield
    if old is None:
        os.environ.pop("SIMRIG_HISTORY", None)
    else:
        os.environ["SIMRIG_HISTORY"] = old


@pytest.fixture
def seed_keyed_by_slot(monkeypatch):
    """A seeded fault for the seeds tests: ``install()`` keys each request's random stream by
    its slot instead of its seed (the installed vLLM's ``SamplingStates.add_request``, patched
    for this test only; every token stays inside its support)."""

    def install() -> None:
        from vllm.v1.worker.gpu.sample.states import SamplingStates

        original = SamplingStates.add_request

        def add_request(self, req_idx, sampling_params):
            needs = original(self, req_idx, sampling_params)
            self.seeds.np[req_idx] = req_idx
            return needs

        monkeypatch.setattr(SamplingStates, "add_request", add_request)

    return install


@pytest.fixture
def ghost_trace(tmp_path):
    """A two-step trace whose second step schedules ``ghost-7``, an id never added:
    the runner must raise KeyError naming it."""
    from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
    from simrig.trace_io.trace import TraceHeader, write_trace

    path = tmp_path / "ghost.jsonl"
    steps = [Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4}),
             Step(cached=[CachedUpdate("a", 4)], num_scheduled_tokens={"a": 1, "ghost-7": 1})]
    write_trace(path, TraceHeader(config=RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16,
                                                      max_model_len=64)), steps)
    return path


# ---------------------------------------------------------------- the Ray tier
# One Ray for each process of the cluster tier (`make test-cluster` runs two xdist workers,
# each with its own), two nodes of one CPU each on this machine (the multi-node path, as a
# cluster runs it): every command a test runs with --workers joins it
# (RAY_ADDRESS) instead of starting its own, and commands run in this process share one
# connection, so the workers that already imported vLLM take the next test's shards.
# A test that needs workers of its own (coverage counts what a fresh process runs once) asks
# for ``fresh_ray_workers``; one whose workers need an environment of their own (a seeded
# fault through sitecustomize) starts its own Ray by leaving RAY_ADDRESS out.
RAY_NODE_CPUS = 1


def _ray_start(args: list[str], log):
    """`ray start ... --block` in its own process group (stopped by group, never `ray stop`,
    which would stop every Ray on the machine)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--block",
                             "--num-cpus", str(RAY_NODE_CPUS), "--disable-usage-stats", *args],
                            env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.3)
    return proc


def _ray_stop(proc) -> None:
    """SIGTERM to the group, then SIGKILL to whatever of it is left (gcs_server outlives
    `ray start --block` at times)."""
    import signal
    import subprocess

    for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A head and a second node (`ray start`, one CPU each); the head's address in
    RAY_ADDRESS while the session runs."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logs = tmp_path_factory.mktemp("ray")
    head = _ray_start(["--head", "--port", str(port), "--include-dashboard=false"], logs / "head.log")
    address = f"127.0.0.1:{port}"
    try:
        node = _ray_start(["--address", address], logs / "node.log")
        old = os.environ.get("RAY_ADDRESS")
        os.environ["RAY_ADDRESS"] = address
        try:
            yield address
        finally:
            _disconnect_ray()
            if old is None:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = old
            _ray_stop(node)
    finally:
        _ray_stop(head)


def _disconnect_ray() -> None:
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(autouse=True)
def _shared_ray(request, monkeypatch):
    """Cluster-marked tests run against the session's Ray, this process connected to it
    (kept between tests: simrig's ray_session reuses a connection the process has)."""
    if request.node.get_closest_marker("cluster") is None:
        yield
        return
    address = request.getfixturevalue("ray_cluster")
    # Ray keeps a worker per environment, and a command's tasks carry its SIMRIG_* settings:
    # memcheck on, as every command has it by default, for the tests that call the sharded
    # replay directly too, so all of them share the same warm workers
    monkeypatch.setenv("SIMRIG_MEMCHECK", "1")
    if "fresh_ray_workers" not in request.fixturenames:
        import signal

        import ray

        if not ray.is_initialized():
            sigterm = signal.getsignal(signal.SIGTERM)  # ray.init replaces it
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
            signal.signal(signal.SIGTERM, sigterm)
    yield


@pytest.fixture
def fresh_ray_workers():
    """The test's commands start their own workers (a new job on the session's Ray)."""
    _disconnect_ray()
    yield
    _disconnect_ray()
