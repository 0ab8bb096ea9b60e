"""What `simrig replay` adds on top of the real calls it drives.

    rig:   replay_trace(path)  = read + validate each line, Harness.run_step,
                                 Checker.check, row/contract tallies
    bare:  Harness(config) + Harness.run_step over the same, pre-parsed steps
           (no file, no checks, no tallies)

Each round runs one bare replay in the (untimed) setup and one rig replay
timed, so both see the same machine load. ``extra_info["overhead_ratio"]`` is
median rig / median bare; the target is <= 1.15 (the rig adds at most 15 %).
The ratio is recorded, not asserted: tests assert behaviour, benchmarks measure.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from simrig.harness import Harness
from simrig.replay import replay_trace
from simrig.trace_io.trace import read_trace

pytestmark = [pytest.mark.bench, pytest.mark.vllm]

ROUNDS = int(os.environ.get("SIMRIG_BENCH_ROUNDS", "5"))
TRACE = Path(os.environ.get("SIMRIG_BENCH_TRACE", Path(__file__).resolve().parents[2]
                            / "traces" / "samples" / "chunked_prefill.jsonl"))


def test_replay_overhead(benchmark, vllm_api):
    header, steps = read_trace(TRACE)
    bare_s: list[float] = []
    rig_s: list[float] = []

    def bare() -> None:
        start = time.perf_counter()
        harness = Harness(header.config, api=vllm_api)
        for step in steps:
            harness.run_step(step)
        bare_s.append(time.perf_counter() - start)

    def rig():
        start = time.perf_counter()
        result = replay_trace(TRACE)
        rig_s.append(time.perf_counter() - start)
        return result

    replay_trace(TRACE)  # warm-up: first Checker / known-findings load, first kernels
    result = benchmark.pedantic(rig, setup=bare, rounds=ROUNDS, iterations=1)
    assert result.num_steps == len(steps)  # the rig replayed every step
    ratio = statistics.median(rig_s) / statistics.median(bare_s)
    benchmark.extra_info.update({
        "trace": TRACE.name, "steps": len(steps), "rounds": ROUNDS,
        "bare_median_ms": round(statistics.median(bare_s) * 1e3, 2),
        "rig_median_ms": round(statistics.median(rig_s) * 1e3, 2),
        "overhead_ratio": round(ratio, 4), "target_ratio": 1.15,
        "device": str(vllm_api.device), "vllm": vllm_api.version,
    })
