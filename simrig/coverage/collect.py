"""Collecting line and branch coverage of the installed vLLM's MRV2 code.

coverage.py's C tracer, over one folder of the installed vLLM (``SCOPE``,
``vllm/v1/worker/gpu``, located without importing vLLM); a gated collector traces only
vLLM's own calls and samples repeated kernel launches (``simrig.trace_gate``). A run's
data leave it as ``CoverageData``: arcs per file, merged by set union.

See docs/coverage.md, 'What it costs' for the tracer's choice and its cost.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from simrig import trace_gate as gate

SCOPE = "vllm/v1/worker/gpu"

Arc = tuple[int, int]  # a jump from line a to b; coverage.py's convention: negative for entry and exit
# {path relative to the vllm package's parent: set of arcs}: pickles, merges by set union and
# does not depend on where vLLM is installed on a shard's machine
CoverageData = dict[str, set[Arc]]


def vllm_root() -> Path | None:
    """The folder holding the ``vllm`` package (site-packages, or a checkout),
    or None when vLLM is not installed. An overlay (simrig bisect) is not
    followed: coverage is of the installed release."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def scope_dir() -> Path | None:
    root = vllm_root()
    return None if root is None else root / SCOPE


# Called before each Collector's first start: simrig.runners drops its idle runners
# here, so every measured run builds (and so reaches) a runner's start-up code.
ON_START: list[Callable[[], None]] = []


class Collector:
    """One coverage.py session over the MRV2 folder; ``start``/``stop`` may
    alternate (time outside them is not measured), ``data()`` is what was
    reached so far.

    Gated (the default), it traces only inside ``gate.vllm_calls()`` regions
    (the harness's builds and steps) and samples kernel launches
    (``simrig.trace_gate``); ``gated=False`` traces everything between
    ``start`` and ``stop`` and every launch."""

    def __init__(self, gated: bool = True) -> None:
        import coverage  # cold path: keeps coverage off simrig --help

        root = vllm_root()
        if root is None:
            raise RuntimeError("vLLM is not installed: nothing to measure")
        self.root = root
        self._cov = coverage.Coverage(
            data_file=None, branch=True, include=[str(root / SCOPE / "*")],
            config_file=False, timid=False)
        # empty takes and modules imported before start are normal here, not warnings
        self._cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-measured",
                                                      "module-not-imported"])
        self.running = False
        self._ever_started = False
        self._taken: dict[str, set[Any]] = {}  # the tracer's raw arcs take() handed out, per file
        self._relative_paths: dict[str, str | None] = {}
        self.switch = gate.Switch(self._pause, self._resume, gated, self._arc_count)

    @property
    def tracer(self) -> str:
        return self._cov._collector.tracer_name() if self._cov._collector else "not started"

    def start(self) -> None:
        if not self.running:
            if not self._ever_started:  # a new measurement, not a take()'s restart
                self._ever_started = True
                for hook in ON_START:
                    hook()
            self._cov.start()
            self.running = True
            self.switch.tracing = True
            gate.activate(self.switch)
            self.switch.apply()  # gated and outside a region: paused at once

    def stop(self) -> None:
        if self.running:
            gate.activate(None)
            self._cov.stop()
            self.running = False

    @property
    def launches(self) -> gate.LaunchSampler:
        return self.switch.launches

    # coverage.py's own pause/resume of its tracers (the collector its start made)
    def _pause(self) -> None:
        self._cov._collector.pause()

    def _resume(self) -> None:
        self._cov._collector.resume()

    def _arc_count(self) -> int:
        return sum(len(arcs) for arcs in self._cov._collector.data.values())

    def take(self) -> CoverageData:
        """Arcs first reached since the last ``take`` (one example's, for
        steering); ``data()`` keeps counting them."""
        return self._arcs(fresh_only=True)

    def data(self) -> CoverageData:
        """Arcs reached so far, keyed by path relative to vLLM's parent folder."""
        return self._arcs(fresh_only=False)

    def _arcs(self, fresh_only: bool) -> CoverageData:
        """The tracer's own sets, read in place: coverage.py's data file (an
        in-memory SQLite database) is never built, since per example it cost
        more than the tracing. The sets only grow, which is what the launch
        sampler counts on."""
        collector = self._cov._collector
        if collector is None:
            return {}
        unpack = _unpack if collector.core.packed_arcs else _as_arc
        out: CoverageData = {}
        for filename, raw in list(collector.data.items()):
            rel = self._relative_paths.get(filename, False)
            if rel is False:
                rel = self._relative_paths[filename] = _relative(filename, self.root)
            if rel is None:
                continue
            if fresh_only:
                seen = self._taken.setdefault(filename, set())
                raw = raw - seen
                seen |= raw
            if raw:
                out.setdefault(rel, set()).update(map(unpack, raw))
        return out

    def __enter__(self) -> Collector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _unpack(packed: int) -> Arc:
    """An arc as coverage.py's C tracer packs it: two 28-bit line numbers,
    their signs in bits 56 and 57 (coverage/ctracer/tracer.c, CTracer_record_pair)."""
    a = packed & 0xFFFFFFF
    b = (packed >> 28) & 0xFFFFFFF
    return (-a if packed & (1 << 56) else a, -b if packed & (1 << 57) else b)


def _as_arc(pair: Any) -> Arc:
    return (int(pair[0]), int(pair[1]))


def _relative(filename: str, root: Path) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(root)
    except ValueError:
        return None
    rel_s = rel.as_posix()
    return rel_s if rel_s.startswith(SCOPE + "/") and rel_s.endswith(".py") else None


def merge(parts: Iterable[Mapping[str, Iterable[Arc]] | None]) -> CoverageData:
    """The union of several runs' (shards', processes') data."""
    out: CoverageData = {}
    for part in parts:
        for path, arcs in (part or {}).items():
            out.setdefault(path, set()).update((int(a), int(b)) for a, b in arcs)
    return out


def to_jsonable(data: Mapping[str, Iterable[Arc]]) -> dict[str, list[list[int]]]:
    return {path: sorted([int(a), int(b)] for a, b in arcs) for path, arcs in sorted(data.items())}


def from_jsonable(raw: Mapping[str, Iterable[Iterable[int]]]) -> CoverageData:
    return {str(path): {(int(a), int(b)) for a, b in arcs} for path, arcs in raw.items()}
