"""The memory this machine can give a run, read before vLLM is loaded.

``available_memory`` is the least of what the machine, the container and the process's
address-space limit leave, less what loading vLLM itself will take;
``SIMRIG_MEMORY_LIMIT_BYTES`` replaces it. The trace reader holds each trace's config to
it (``simrig.trace_io.bounds.check_config``; traces/README.md, *Bounds*).
"""

from __future__ import annotations

import math
import os
import resource

MEMORY_ENV = "SIMRIG_MEMORY_LIMIT_BYTES"  # overrides the memory this process is taken to have
# What loads after the traces are read: vLLM, torch and Triton map about 1.3 GB of address
# space on a 2-core CPU machine (the least RLIMIT_AS a one-step replay runs under), each
# CPU's thread a stack and a malloc arena more; about 0.7 GB of it is resident.
RUNTIME_MAPPED = (1408 << 20) + (os.cpu_count() or 1) * (72 << 20)
RUNTIME_RESIDENT = 768 << 20


def format_bytes(n: int) -> str:
    """2_100_000_000_000 -> '2.1 TB' (decimal units, as memory is usually quoted);
    past 1000 EB, the power of ten ('10^40 B')."""
    if n >= 10**21:
        return f"10^{math.floor(math.log10(n))} B"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if value < 999.95:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} EB"


def parse_byte_count(text: str) -> int:
    """'6000000000', '6G', '512M' (binary multiples, as ``ulimit`` and ``free`` use) -> bytes."""
    raw = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if raw and raw[-1] in "KMGT":
        scale = 1024 ** ("KMGT".index(raw[-1]) + 1)
        raw = raw[:-1]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 30:
        raise ValueError(f"{MEMORY_ENV} must be a number of bytes (e.g. 6000000000 or 6G), got {text!r}")
    return int(raw) * scale


def _read_int(path: str, key: str | None = None) -> int | None:
    """An integer file (``memory.max``), or ``key:  N kB`` in a /proc table; None when absent."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            if key is None:
                text = f.read().strip()
                return int(text) if text.isdigit() else None
            for line in f:
                name, _, rest = line.partition(":")
                if name == key:
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        return int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except (OSError, ValueError):
        return None
    return None


def available_memory() -> tuple[int, str] | None:
    """(bytes, how it reads in a sentence) left for a runner's buffers: the least of the
    machine's MemAvailable and the cgroup's limit less its usage, each less what loading
    vLLM will make resident (``RUNTIME_RESIDENT``, less what this process already holds),
    and the address-space limit (RLIMIT_AS) less the larger of what is mapped and
    ``RUNTIME_MAPPED``; ``SIMRIG_MEMORY_LIMIT_BYTES`` replaces them all. None when nothing
    can be read (the check is skipped)."""
    override = os.environ.get(MEMORY_ENV)
    if override:
        n = parse_byte_count(override)
        return n, f"{MEMORY_ENV} allows {format_bytes(n)}"
    status = "/proc/self/status"
    runtime = max(0, RUNTIME_RESIDENT - (_read_int(status, "VmRSS") or 0))
    less = f", less {format_bytes(runtime)} to load vLLM" if runtime else ""
    found: list[tuple[int, str]] = []
    avail = _read_int("/proc/meminfo", "MemAvailable")
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    if avail is not None:
        found.append((max(0, avail - runtime), f"this machine has {format_bytes(avail)} available{less}"))
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 1 << 60:
            left = max(0, limit - usage)
            found.append((max(0, left - runtime),
                          f"this container has {format_bytes(left)} left of its memory limit{less}"))
            break
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        mapped = max(_read_int(status, "VmSize") or 0, RUNTIME_MAPPED)
        left = max(0, soft - mapped)
        found.append((left, f"this process may map {format_bytes(left)} more (RLIMIT_AS {format_bytes(soft)} "
                            f"less {format_bytes(mapped)} for itself and vLLM)"))
    return min(found) if found else None
