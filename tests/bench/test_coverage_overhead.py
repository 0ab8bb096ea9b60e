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
    benchmark.extra_info.update({"trace": TRACE.name, "steps": n, "tracer": collector.tracer,
                                 **_paired_ratio([s / n for s in off_s], [s / n for s in on_s])})


def _paired_ratio(off_per_step: list[float], on_per_step: list[float]) -> dict:
    """Per-step medians off and on, their ratio, and with 3 or more paired rounds the
    ratio with its 95 % paired bootstrap interval."""
    info = {"rounds": len(on_per_step),
            "off_ms_per_step": round(statistics.median(off_per_step) * 1e3, 3),
            "on_ms_per_step": round(statistics.median(on_per_step) * 1e3, 3),
            "ratio_median": round(statistics.median(on_per_step) / statistics.median(off_per_step), 4)}
    if len(on_per_step) >= 3 and len(off_per_step) == len(on_per_step):
        r = bootstrap_ratio(off_per_step, on_per_step)
        info.update(ratio=round(r.ratio, 4), ratio_low=round(r.low, 4), ratio_high=round(r.high, 4))
    return info


EXAMPLES = int(os.environ.get("SIMRIG_BENCH_COVERAGE_EXAMPLES", "60"))


def test_coverage_overhead_per_campaign_step(benchmark, vllm_api, tmp_path):
    """The campaign a nightly run is: ``EXAMPLES`` valid examples (seed 4, no database, no
    regressions) without coverage (setup, untimed) and with it (timed), per round; the
    ratio of the seconds per step, with its paired interval. Coverage is on by default in
    fuzz and replay because this stays near 1 (only vLLM's calls are traced, repeated
    kernel launches are sampled: simrig/trace_gate.py)."""
    from simrig.campaign.fuzz import Campaign, CampaignOptions

    off_s: list[float] = []
    on_s: list[float] = []
    runs = iter(range(10_000))

    def campaign(coverage: bool) -> tuple[float, dict]:
        options = CampaignOptions(budget_s=None, max_examples=EXAMPLES, seed=4, database=None,
                                  replay_regressions=False, coverage=coverage, progress="quiet",
                                  out_dir=tmp_path / f"run-{next(runs)}")
        run = Campaign(options)
        run.run()
        summary = run.summary()
        return summary["elapsed_s"] / max(1, summary["steps"]), summary

    def off() -> None:
        off_s.append(campaign(False)[0])

    def on() -> dict:
        per_step, summary = campaign(True)
        on_s.append(per_step)
        return summary

    summary = benchmark.pedantic(on, setup=off, rounds=ROUNDS, iterations=1)
    assert summary["coverage_arcs"] > 0  # the campaign measured MRV2 code
    if not off_s:  # benchmarking disabled (the smoke test): pedantic ran no setup
        off()
    benchmark.extra_info.update({"examples": EXAMPLES, "steps": summary["steps"],
                                 **_paired_ratio(off_s, on_s)})
