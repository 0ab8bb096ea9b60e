"""Connecting to Ray: a local cluster on this machine's cores, or an existing one.

    --ray ADDRESS   join that cluster ("auto": the one `ray start` runs here)
    RAY_ADDRESS     the same, from the environment
    neither         start a private local Ray with one CPU per worker

Every way this can fail (Ray not installed, nothing listening at the address)
is a ``UsageError``: one line, exit 2, before any report directory exists.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from simrig.errors import UsageError

RAY_EXTRA = "pip install 'simrig[ray]'"
# How long a cluster's address may take to accept a connection before it counts
# as unreachable.
CONNECT_TIMEOUT_S = 10


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
        import ray
    except ImportError:
        raise UsageError(f"--workers: Ray is not installed ({RAY_EXTRA})") from None
    return ray


def cluster_address(address: str | None) -> str | None:
    """The cluster to join: --ray, else RAY_ADDRESS, else None (start a local one)."""
    return address or os.environ.get("RAY_ADDRESS") or None


@contextmanager
def ray_session(workers: int, address: str | None = None) -> Iterator[Any]:
    """``ray.init`` for the duration of a command; ``ray.shutdown`` after."""
    ray = import_ray()
    address = cluster_address(address)
    common = dict(include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                  configure_logging=True)
    if address:
        check_reachable(address)
    env = dict(os.environ)
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
    try:
        yield ray
    finally:
        ray.shutdown()


def check_reachable(address: str) -> None:
    """A HOST:PORT address must accept a TCP connection within CONNECT_TIMEOUT_S:
    ``ray.init`` itself retries an unreachable GCS for ever."""
    import socket

    if address == "auto" or "://" in address:
        return  # "auto" reads the local session file; ray:// clients time out on their own
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray: expected HOST:PORT or 'auto', got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise UsageError(f"--ray: cannot reach a Ray cluster at {address!r}: {exc}") from None


def pinned_here(ray: Any) -> dict[str, Any]:
    """Actor options that keep it on the driver's node (it writes the driver's files)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def worker_name() -> str:
    """host:pid/node of the process running a shard (node: Ray node id, 8 hex digits)."""
    import socket

    try:
        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
    except Exception:  # noqa: BLE001 -- outside a Ray worker
        node = "-"
    return f"{socket.gethostname()}:{os.getpid()}/{node}"
