"""``simrig replay --workers N``: trace x PCP size x segment units on Ray, one merged result.

``plan_units`` cuts long traces into segments, ``replay_unit`` replays one through the
one replay loop (the steps before it parsed only, then a resync step), and
``merge_units`` merges the results in trace / PCP / segment order, so the tables equal
a one-process replay's. ``replay_sharded`` is the driver.

See docs/ray.md, 'Replay segments'.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simrig.coverage.collect import Collector
from simrig.distributed.cluster import ray_session, worker_name, worker_options
from simrig.distributed.merge import concat_frames
from simrig.findings.classes import ClassTally, Where, merge_tallies
from simrig.findings.findings import Finding
from simrig.replay import (
    FIRST_FINDINGS,
    KNOWN_ROWS_PER_SIGNATURE,
    BatchTracker,
    ReplayRecorder,
    ReplayResult,
    replay_args,
    run_steps,
    scan_trace,
    sort_rows,
)
from simrig.sources.live import RunnerMirror
from simrig.step import Step
from simrig.trace_io.trace import TraceReader
from simrig.vllm_runtime.interpreter_patches import memcheck_ran

MIN_SEGMENT_STEPS = 200  # below this a resync costs more than the parallelism gains


@dataclass(frozen=True)
class Unit:
    order: int  # position in a one-process replay
    path: str
    pcp_size: int
    start: int  # first step (0: from the beginning, no resync)
    stop: int  # one past the last step
    cudagraph_mode: str | None = None  # replay under this mode instead of the trace's

    @property
    def num_steps(self) -> int:
        return self.stop - self.start


def plan_units(traces: Sequence[tuple[str, int, int, bool]], workers: int,
               segment_steps: int | None = None) -> list[Unit]:
    """traces: (path, steps, pcp_size, adversarial) per trace x PCP size, in replay order.
    Segment length: ``segment_steps``, else max(MIN_SEGMENT_STEPS, total / workers)."""
    total = sum(n for _, n, _, _ in traces)
    length = segment_steps or max(MIN_SEGMENT_STEPS, math.ceil(total / max(workers, 1)))
    units: list[Unit] = []
    for path, n, pcp_size, adversarial in traces:
        parts = 1 if adversarial or n <= length else math.ceil(n / length)
        bounds = [round(i * n / parts) for i in range(parts + 1)]
        for a, b in zip(bounds, bounds[1:]):
            units.append(Unit(len(units), str(path), pcp_size, a, b))
    return units


@dataclass
class UnitResult:
    unit: Unit
    steps: Any
    findings: Any
    contract: dict[tuple[str, str, str, str], list[Any]]
    first_findings: list[Finding]
    known_elided: dict[str, int]
    num_steps: int
    seconds: float
    vllm_version: str = ""
    device: str = ""
    worker: str = ""
    classes: ClassTally = field(default_factory=ClassTally)  # true occurrences, first/last place
    unavailable: list[dict[str, Any]] = field(default_factory=list)  # stages this release lacks
    coverage: dict[str, set[tuple[int, int]]] | None = None  # arcs of vLLM's MRV2 code reached
    vllm_s: float = 0.0  # inside vLLM's calls (StepObs.vllm_s summed)
    memcheck: bool = False  # the worker's kernels ran under memcheck (its registry entry installed)


def replay_unit(unit: Unit, stages: tuple[str, ...], coverage: bool = False) -> UnitResult:
    """A Ray task: one unit through ``run_steps``; step numbers are the trace's own.
    ``coverage``: the arcs of vLLM's MRV2 code this unit reached come back with it."""
    from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

    api = load()
    reader = TraceReader(unit.path)
    header = reader.header
    config = header.config.replayed_as(unit.pcp_size, unit.cudagraph_mode)
    tracker, mirror, rec = BatchTracker(), RunnerMirror(), ReplayRecorder()
    rec.where = Where(unit.path, unit.pcp_size, replay_args=replay_args(header.config, config, stages))
    if unit.start == 0:  # once per trace x PCP size, as a one-process replay lists them
        rec.unavailable = [{"trace": unit.path, "pcp_size": config.pcp_size, "stage": u.stage,
                            "capability": u.capability, "reason": u.reason}
                           for u in api.unavailable(config)]
    shift = unit.start - 1 if unit.start else 0  # replayed index -> trace step

    def steps() -> Iterator[tuple[int, Step]]:
        for i, (line, step) in enumerate(reader):
            if i >= unit.stop:
                return
            if i < unit.start:
                mirror.apply(step)
                tracker.observe(step)
                continue
            if i == unit.start and unit.start:
                yield -1, mirror.resync_step()
            yield line, step

    collector = None
    if coverage:
        collector = Collector()
        collector.start()
    started = time.perf_counter()
    try:
        for replayed in run_steps(header, steps(), name=unit.path, config=config, stages=stages,
                                  api=api):
            if replayed.line == -1:
                continue  # the resync step is scaffolding, not part of the trace
            observation = replayed.observation
            if shift:
                observation = dataclasses.replace(observation, index=observation.index + shift)
                for finding in replayed.findings:
                    finding.step += shift
            rec.record(unit.path, unit.pcp_size, replayed.line, replayed.step,
                       tracker.observe(replayed.step), observation, replayed.findings)
    finally:
        if collector is not None:
            collector.stop()
        reader.close()
    return UnitResult(unit, rec.steps.to_frame(), rec.findings.to_frame(), rec.contract,
                      rec.first_findings, rec.known_elided, rec.num_steps,
                      time.perf_counter() - started, api.version,
                      f"{api.device} ({api.platform.mode})", worker_name(), rec.classes,
                      rec.unavailable, collector.data() if collector is not None else None,
                      vllm_s=rec.vllm_s, memcheck=memcheck_ran())


@dataclass
class MergedReplay:
    result: ReplayResult
    units: list[UnitResult] = field(default_factory=list)
    wall_s: float = 0.0


def merge_units(results: list[UnitResult], traces: Sequence[str], pcp_sizes: Sequence[int],
                stages: Sequence[str], wall_s: float) -> ReplayResult:
    """One ReplayResult as a one-process replay of the same traces would give
    (built by the same ``ReplayRecorder.result``: class table, reproducers,
    known-finding explanations)."""
    results = sorted(results, key=lambda r: r.unit.order)
    rec = ReplayRecorder()
    for r in results:
        for key, (count, *first) in r.contract.items():
            entry = rec.contract.get(key)
            if entry is None:
                rec.contract[key] = [count, *first]
            else:
                entry[0] += count
        for kind, n in r.known_elided.items():
            rec.known_elided[kind] = rec.known_elided.get(kind, 0) + n
        for finding in r.first_findings:
            if sum(f.known == finding.known for f in rec.first_findings) < FIRST_FINDINGS:
                rec.first_findings.append(finding)
        rec.unavailable += r.unavailable
        rec.trace_lengths[r.unit.path] = max(rec.trace_lengths.get(r.unit.path, 0), r.unit.stop)
    rec.classes = merge_tallies((r.classes, None) for r in results)
    rec.num_steps, rec.replay_s = sum(r.num_steps for r in results), wall_s
    rec.vllm_s = sum(r.vllm_s for r in results)
    first = results[0] if results else None
    result = rec.result(list(traces), list(pcp_sizes), tuple(stages),
                        vllm_version=first.vllm_version if first else "",
                        device=first.device if first else "")
    findings = concat_frames([r.findings for r in results])
    if len(findings):
        findings = _recap_known(sort_rows(findings, ("trace", "pcp_size", "step", "stage", "rank",
                                                     "kind", "check", "field", "req_ids", "message")),
                                result.known_elided)
    steps = concat_frames([r.steps for r in results])
    return dataclasses.replace(
        result, findings=findings if len(findings) else result.findings,
        steps=sort_rows(steps, ("trace", "pcp_size", "step", "stage", "rank")) if len(steps)
        else result.steps)


def _recap_known(findings: Any, elided: dict[str, int]) -> Any:
    """Keep the first KNOWN_ROWS_PER_SIGNATURE known rows per (trace, PCP size,
    check, signature) over all segments; count the rest in ``elided``."""
    if not len(findings):
        return findings
    known = findings["known"].astype(bool)
    group = ["trace", "pcp_size", "check", "kind", "stage", "field", "exception_type"]
    rank = findings[known].groupby([findings[c].astype(str) for c in group]).cumcount()
    over = rank[rank >= KNOWN_ROWS_PER_SIGNATURE].index
    for kind, n in findings.loc[over, "kind"].astype(str).value_counts().items():
        elided[kind] = elided.get(kind, 0) + int(n)
    return findings.drop(index=over).reset_index(drop=True)


def replay_sharded(paths: Sequence[Path], *, workers: int, address: str | None,
                   pcp_sizes: Sequence[int] | None, stages: tuple[str, ...],
                   segment_steps: int | None = None, progress: Any = None,
                   cudagraph_mode: str | None = None,
                   stop: Callable[[], bool] | None = None, coverage: bool = False) -> MergedReplay:
    """Replay traces on Ray workers; the merged result of every unit (of every
    unit back before ``stop()`` turned true, the rest cancelled)."""
    listing, used = [], []
    for path in paths:
        header, n = scan_trace(path)
        for size in (pcp_sizes or [header.config.pcp_size]):
            listing.append((str(path), n, size, header.adversarial))
            if size not in used:
                used.append(size)
    units = [dataclasses.replace(u, cudagraph_mode=cudagraph_mode)
             for u in plan_units(listing, workers, segment_steps)]
    started = time.perf_counter()
    results: list[UnitResult] = []
    with ray_session(workers, address) as ray:
        task = ray.remote(num_cpus=1, max_retries=2, **worker_options())(replay_unit)
        pending = [task.remote(u, stages, coverage) for u in sorted(units, key=lambda u: -u.num_steps)]
        done_steps = 0
        while pending:
            if stop is not None and stop():
                for ref in pending:
                    ray.cancel(ref, force=True)
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in ready:
                result = ray.get(ref)
                results.append(result)
                done_steps += result.num_steps
            if progress is not None and ready:
                progress.update(done_steps, 0, 0)
    wall = time.perf_counter() - started
    merged = merge_units(results, [str(p) for p in paths], used, stages, wall)
    return MergedReplay(merged, sorted(results, key=lambda r: r.unit.order), wall)
