"""What coverage (``--coverage``) costs per replayed step.

Each round replays the same trace twice, back to back: once without a tracer
(the untimed setup) and once under simrig's coverage collector (coverage.py's
C tracer with branch arcs over vLLM's MRV2 folder, timed), so both see the
same machine load. ``extra_info`` holds the per-step medians, the ratio
on/off of the round means and its 95 % paired bootstrap interval over the
rounds (``simrig.bench.stats.bootstrap_ratio``). Recorded, not asserted.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from simrig.bench.stats import bootstrap_ratio
from simrig.coverage.collect import Collector
from simrig.replay import replay_trace

pytestmark = [pytest.mark.bench, pytest.mark.vllm]

ROUNDS = int(os.environ.get("SIMRIG_BENCH_ROUNDS", "5"))
TRACE = Path(os.environ.get("SIMRIG_BENCH_TRACE", Path(__file__).resolve().parents[2]
                            / "traces" / "samples" / "chunked_prefill.jsonl"))


def test_coverage_overhead_per_step(benchmark, vllm_api):
    off_s: list[float] = []
    on_s: list[float] = []
    steps: list[int] = []

    def off() -> None:
        start = time.perf_counter()
        replay_trace(TRACE)
        off_s.append(time.perf_counter() - start)

    def on():
        collector = Collector()
        start = time.perf_counter()
        collector.start()
        try:
            result = replay_trace(TRACE)
        finally:
            collector.stop()
        on_s.append(time.perf_counter() - start)
        steps.append(result.num_steps)
        return collector

    replay_trace(TRACE)  # warm-up: first Checker / known-findings load, first kernels
    collector = benchmark.pedantic(on, setup=off, rounds=ROUNDS, iterations=1)
    assert sum(len(arcs) for arcs in collector.data().values()) > 0  # the tracer saw MRV2 code
    n = steps[-1]
    if not off_s:  # benchmarking disabled (the smoke test): pedantic ran no setup
        off()
    info = {"trace": TRACE.name, "steps": n, "rounds": len(on_s), "tracer": collector.tracer,
            "off_ms_per_step": round(statistics.median(off_s) / n * 1e3, 3),
            "on_ms_per_step": round(statistics.median(on_s) / n * 1e3, 3),
            "ratio_median": round(statistics.median(on_s) / statistics.median(off_s), 4)}
    if len(on_s) >= 3 and len(off_s) == len(on_s):
        r = bootstrap_ratio(off_s, on_s)
        info.update(ratio=round(r.ratio, 4), ratio_low=round(r.low, 4), ratio_high=round(r.high, 4))
    benchmark.extra_info.update(info)
