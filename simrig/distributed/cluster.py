"""Connecting to Ray: a local cluster on this machine's cores, or an existing one.

``ray_session`` joins the cluster ``--ray ADDRESS`` (or ``RAY_ADDRESS``) names, else
starts a private local Ray with one CPU per worker. Every way this can fail is a
``UsageError`` (one line, exit 2) before any report directory exists: an address is
probed first (``check_reachable``, within ``SIMRIG_RAY_TIMEOUT`` seconds).

See docs/ray.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from simrig.errors import UsageError

RAY_EXTRA = "pip install 'simrig[ray]'"
# How long a cluster's address may take, all told, to answer as a Ray GCS
# before it counts as unreachable (SIMRIG_RAY_TIMEOUT overrides).
TIMEOUT_ENV = "SIMRIG_RAY_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0
# HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its SETTINGS.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 4
_GCS_PROBE = ("import sys\nfrom ray._raylet import GcsClient\n"
              "GcsClient(address=sys.argv[1], cluster_id=None).cluster_id\n")
_answered: set[str] = set()  # addresses that answered as Ray in this process
# Settings only the driver reads (where the report and history go, how it reaches the cluster):
# left out of a worker's environment, so a worker kept from an earlier command is reused.
_DRIVER_ONLY = frozenset({"SIMRIG_HISTORY", "SIMRIG_RAY_TIMEOUT", "SIMRIG_DOCS_URL", "SIMRIG_ACROSS_RELEASES",
                          "SIMRIG_FAILURES", "SIMRIG_VENVS", "SIMRIG_WHEELS"})


def add_distributed_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """--workers / --ray, shared by fuzz, replay and selftest (needs simrig[ray])."""
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help=f"{what} (needs the simrig[ray] extra; default: one process, no Ray)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="join this Ray cluster ('auto': the one `ray start` runs here; default "
                        "RAY_ADDRESS, else start a local Ray with N CPUs); implies --workers")


def distributed_workers(args: argparse.Namespace) -> int | None:
    """The worker count when the command should run on Ray, else None. Checks,
    before anything runs, that Ray is installed and the cluster reachable."""
    if args.workers is None and not args.ray:
        return None
    workers = args.workers if args.workers is not None else 1
    if workers < 1:
        raise UsageError(f"--workers: must be >= 1, got {workers}")
    import_ray()
    address = cluster_address(args.ray)
    if address:
        check_reachable(address)
    return workers


def import_ray() -> Any:
    try:
        import ray  # optional: ray
    except ImportError:
        raise UsageError(f"--workers: Ray is not installed ({RAY_EXTRA})") from None
    return ray


def cluster_address(address: str | None) -> str | None:
    """The cluster to join: --ray, else RAY_ADDRESS, else None (start a local one)."""
    return address or os.environ.get("RAY_ADDRESS") or None


@contextmanager
def ray_session(workers: int, address: str | None = None) -> Iterator[Any]:
    """``ray.init`` for the duration of a command; ``ray.shutdown`` after. Ray
    replaces the SIGTERM handler on init; the command's own one is put back. A process
    already connected to Ray (a notebook, a test session) keeps its connection: the command
    runs on that cluster, and its idle workers, vLLM already imported, take the shards."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    address = cluster_address(address)
    common = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                  configure_logging=True)
    if address:
        check_reachable(address)
    env = dict(os.environ)
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if address:
            ray.init(address=address, **common)
        else:
            os.environ.pop("RAY_ADDRESS", None)
            # "local": a private Ray even when `ray start` runs one on this machine.
            # Ray nices its workers (15) by default: on a machine shared with other work
            # the shards would then get only the CPU nobody else wants.
            ray.init(address="local", num_cpus=workers, _system_config={"worker_niceness": 0},
                     **common)
    except Exception as exc:  # noqa: BLE001 -- Ray raises many types for one cause
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = f"cannot reach a Ray cluster at {address!r}" if address else "cannot start a local Ray"
        raise UsageError(f"--ray: {where}: {first[:200]}") from None
    finally:
        os.environ.clear()
        os.environ.update(env)
        if main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    try:
        yield ray
    finally:
        ray.shutdown()


def probe_timeout() -> float:
    """Seconds an address may take to answer as a Ray GCS (SIMRIG_RAY_TIMEOUT, default 30)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{TIMEOUT_ENV}: expected a number of seconds > 0, got {text!r}")
    return value


def check_reachable(address: str) -> None:
    """The address must answer as a Ray cluster's GCS within ``probe_timeout()``
    (``SIMRIG_RAY_TIMEOUT``, default 30 s all told); ``ray.init`` itself would retry an
    address that does not answer as a GCS for ever::

        TCP connect ──► HTTP/2 preface (Ray's GCS speaks gRPC; a web server, e.g. the
                        dashboard port, answers HTTP/1 and is refused at once) ──►
                        Ray's own GCS client in a child process (killed at the deadline)
    """
    if "://" in address or address in _answered:
        return  # ray:// clients time out on their own
    timeout = probe_timeout()
    deadline = time.monotonic() + timeout
    given = address
    if address == "auto":
        address = _auto_address()
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray: expected HOST:PORT or 'auto', got {address!r}")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as exc:
        raise UsageError(f"--ray: cannot reach a Ray cluster at {address!r}: {exc}") from None
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
            _check_grpc(sock, address, deadline, timeout)
    _check_gcs(address, deadline, timeout)
    _answered.add(given)


def _auto_address() -> str:
    """The GCS address `ray start` recorded on this machine (what ray.init("auto") joins)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die  # optional: ray

        return canonicalize_bootstrap_address_or_die("auto")
    except Exception as exc:  # noqa: BLE001 -- Ray raises ConnectionError and others
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--ray auto: no Ray cluster to join on this machine ({first[:200]})") from None


def _check_grpc(sock: Any, address: str, deadline: float, timeout: float) -> None:
    """A Ray GCS is a gRPC (HTTP/2) server: it answers the preface with SETTINGS."""
    reply = b""
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        sock.sendall(_H2_HELLO)
        while len(reply) < 9:
            chunk = sock.recv(9 - len(reply))
            if not chunk:
                break
            reply += chunk
    except TimeoutError:
        raise UsageError(f"--ray: {address!r} accepts connections but did not answer as a Ray "
                         f"cluster within {timeout:g} s ({TIMEOUT_ENV})") from None
    except OSError:
        pass  # reset by the peer: judged by what it said before
    if len(reply) == 9 and reply[3] == _SETTINGS:
        return
    web = reply.startswith(b"HTTP/") or reply.lstrip().startswith(b"<")
    said = ("answers HTTP (a web server, or Ray's dashboard?)" if web
            else "closed the connection" if not reply else "does not speak gRPC")
    raise UsageError(f"--ray: {address!r} is not a Ray cluster: it {said}; give the head's GCS "
                     "address (`ray start --head --port`, default 6379)")


def _check_gcs(address: str, deadline: float, timeout: float) -> None:
    """Ray's own GCS client, in a child process killed at the deadline (its
    retries and warnings stay there)."""
    try:
        done = subprocess.run([sys.executable, "-c", _GCS_PROBE, address], capture_output=True,
                              text=True, timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise UsageError(f"--ray: {address!r} did not answer as a Ray cluster within {timeout:g} s "
                         f"({TIMEOUT_ENV})") from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
        raise UsageError(f"--ray: {address!r} did not answer as a Ray cluster: "
                         f"{(lines[-1] if lines else f'exit {done.returncode}')[:200]}")


def worker_options() -> dict[str, Any]:
    """Task options that give a shard's process the command's own SIMRIG_* settings.
    A worker inherits the environment its cluster was started with, not the command's:
    SIMRIG_MEMCHECK above all is read when the worker imports vLLM, so a --no-memcheck
    command on a cluster started with memcheck (or the reverse) would judge kernels other
    than it says. Ray keeps a worker per environment, so workers are still reused across
    commands that ask for the same settings."""
    env = {k: v for k, v in os.environ.items() if k.startswith("SIMRIG_") and k not in _DRIVER_ONLY}
    return {"runtime_env": {"env_vars": env}} if env else {}


def pinned_here(ray: Any) -> dict[str, Any]:
    """Actor options that keep it on the driver's node (it writes the driver's files)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # optional: ray

    node = ray.get_runtime_context().get_node_id()
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def worker_name() -> str:
    """host:pid/node of the process running a shard (node: Ray node id, 8 hex digits)."""
    try:
        import ray  # optional: ray

        node = ray.get_runtime_context().get_node_id()[:8]
    except Exception:  # noqa: BLE001 -- outside a Ray worker
        node = "-"
    return f"{socket.gethostname()}:{os.getpid()}/{node}"
