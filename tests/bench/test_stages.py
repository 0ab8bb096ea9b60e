"""Real code: per-stage latency of the MRV2 input path, and the rig's overhead.

Each round replays the bundled trace (see conftest) from a fresh runner:

    round:  Harness(config) --run_step--> StepObs per step
                                          stage durations (perf_counter around
                                          each real call, recorded by the harness)

The benchmark times a whole replay; the per-stage medians over every call in
every round go to ``extra_info`` (``<stage>_median_ms``, ``<stage>_calls``).

Rig overhead: the same real functions called bare, without the harness
(no observation copies, no timing wrappers, no stand-in bookkeeping):

    bare:   build_runner -> finish/add/update -> gather_batch_req_state
            -> prepare_inputs -> get_num_sampled_and_rejected
            -> postprocess_sampled -> InputBatch.make_dummy

A bare replay runs in each round's (untimed) setup, interleaved with the
timed harness replay, so both see the same machine load;
``extra_info["overhead_ratio"]`` = median harness replay / median bare replay;
``extra_info["outside_stages_share"]`` = share of harness replay time spent
outside the timed real calls (a same-run figure, steadier on a loaded machine).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
import pytest

from simrig import observe as obs

pytestmark = [pytest.mark.bench, pytest.mark.vllm]

ROUNDS = int(os.environ.get("SIMRIG_BENCH_ROUNDS", "5"))
TIMED_STAGES = (obs.GATHER, obs.PREPARE, obs.DUMMY, obs.PARTITION)


def _trace_info(trace: Any, api: Any) -> dict[str, Any]:
    return {"trace": trace.name, "steps": len(trace.steps), "max_reqs": trace.max_reqs,
            "total_tokens": trace.total_tokens, "pcp_size": trace.config.pcp_size,
            "device": str(api.device), "mode": api.platform.mode, "vllm": api.version}


def _harness_replay(harness: Any, steps: list, sink: list[obs.StepObs]) -> None:
    for step in steps:
        result = harness.run_step(step)
        sink.append(result)


def _stage_medians(results: list[obs.StepObs]) -> dict[str, Any]:
    durations: dict[str, list[float]] = {s: [] for s in TIMED_STAGES}
    for result in results:
        for stage in result.stages:
            if stage.stage in durations:
                durations[stage.stage].append(stage.duration_s)
    info: dict[str, Any] = {}
    for stage, values in durations.items():
        info[f"{stage}_calls"] = len(values)
        info[f"{stage}_median_ms"] = (round(statistics.median(values) * 1e3, 4)
                                      if values else None)
    return info


@pytest.mark.parametrize("pcp_size", [1, 2, 4], ids=lambda p: f"pcp{p}")
def test_stage_latency(benchmark, vllm_api, bench_trace, pcp_size: int) -> None:
    from simrig.harness import Harness

    trace = bench_trace.with_pcp(pcp_size)
    results: list[obs.StepObs] = []

    def setup() -> tuple[tuple, dict]:
        return (Harness(trace.config, api=vllm_api), trace.steps, results), {}

    benchmark.group = "stages"
    benchmark.pedantic(_harness_replay, setup=setup, rounds=ROUNDS, iterations=1)
    errors = [(r.index, s.stage, s.rank, s.error) for r in results for s in r.errors]
    assert errors == [], errors[:3]
    info = _stage_medians(results)
    benchmark.extra_info.update(_trace_info(trace, vllm_api))
    benchmark.extra_info.update(info)
    assert info["gather_calls"] > 0 and info["prepare_calls"] > 0 and info["dummy_calls"] > 0
    # The real runner partitions only with PCP > 1: once per rank per step.
    assert info["partition_calls"] == (info["prepare_calls"] * pcp_size if pcp_size > 1 else 0)


def _bare_replay(api: Any, runner: Any, dummy_buffers: Any, steps: list) -> int:
    """The real calls in execute_model's order, nothing else; returns steps run."""
    torch = api.torch
    device = api.device
    done = 0
    for step in steps:
        so = api.scheduler_output(step)
        runner.finish_requests(so)
        runner.add_requests(so)
        runner.update_requests(so)
        num_reqs, num_tokens = len(step.num_scheduled_tokens), step.total_num_scheduled_tokens
        if num_reqs:
            batch_state, _ = runner.gather_batch_req_state(so, False)
            desc = api.batch_descriptor(batch_state.num_tokens)
            batch = runner.prepare_inputs(so, batch_state, desc, 0)
            n = batch.num_reqs
            # Sampler outcome: every logit samples token 0, nothing rejected.
            num_logits = np.diff(batch.cu_num_logits_np[: n + 1]).astype(np.int32)
            sampled = torch.zeros((n, max(int(num_logits.max()), 1)), dtype=torch.int64)
            num_sampled, num_rejected = api.get_num_sampled_and_rejected(
                torch.from_numpy(num_logits).to(device), batch.seq_lens[:n],
                batch.cu_num_logits, batch.idx_mapping, runner.req_states.prefill_len.gpu)
            runner.postprocess_sampled(batch.idx_mapping, sampled.to(device), num_sampled,
                                       num_rejected, batch.query_start_loc)
        if 0 < num_reqs <= num_tokens:
            api.InputBatch.make_dummy(num_reqs, num_tokens, dummy_buffers)
        done += 1
    return done


def test_rig_overhead(benchmark, vllm_api, bench_trace) -> None:
    from simrig.harness import Harness

    trace = bench_trace.with_pcp(1)  # no partition: both paths make the same real calls
    bare_s: list[float] = []
    harness_s: list[float] = []
    results: list[obs.StepObs] = []

    def setup() -> tuple[tuple, dict]:
        runner = vllm_api.build_runner(trace.config)
        buffers = vllm_api.dummy_buffers(trace.config)
        start = time.perf_counter()
        assert _bare_replay(vllm_api, runner, buffers, trace.steps) == len(trace.steps)
        bare_s.append(time.perf_counter() - start)
        return (Harness(trace.config, api=vllm_api),), {}

    def replay(harness: Any) -> None:
        # Timed here too: the benchmark's own stats are absent under --benchmark-disable.
        start = time.perf_counter()
        _harness_replay(harness, trace.steps, results)
        harness_s.append(time.perf_counter() - start)

    benchmark.group = "rig overhead"
    benchmark.pedantic(replay, setup=setup, rounds=ROUNDS, iterations=1)
    assert [s.error for r in results for s in r.errors] == []
    assert len(bare_s) == len(harness_s) >= 1
    bare, harness = statistics.median(bare_s), statistics.median(harness_s)
    # Same-run view, immune to load drift between the two paths: the share of
    # harness time spent outside the timed real calls (Step -> SchedulerOutput
    # mapping, observation copies, bookkeeping).
    staged = sum(stage.duration_s for r in results for stage in r.stages)
    outside = 1 - staged / sum(harness_s)
    benchmark.extra_info.update(_trace_info(trace, vllm_api))
    benchmark.extra_info.update({"bare_median_ms": round(bare * 1e3, 3),
                                 "harness_median_ms": round(harness * 1e3, 3),
                                 "overhead_ratio": round(harness / bare, 4),
                                 "outside_stages_share": round(outside, 4)})
    assert bare > 0 and harness > 0 and 0 <= outside < 1


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_cudagraph_mode_cost(benchmark, vllm_api, bench_trace, mode: str) -> None:
    """Per-step cost of a graph mode (dispatch, padded prepare, capture dummy)
    against the same trace eager, interleaved round by round. Target (README,
    *Benchmarks*): ``per_step_ratio_vs_eager`` <= 1.5."""
    from simrig.harness import Harness

    trace = bench_trace.with_pcp(1)
    graph_config = trace.config.replayed_as(trace.config.pcp_size, mode)
    eager_s: list[float] = []
    graph_s: list[float] = []
    results: list[obs.StepObs] = []

    def setup() -> tuple[tuple, dict]:
        eager = Harness(trace.config, api=vllm_api)
        start = time.perf_counter()
        _harness_replay(eager, trace.steps, [])
        eager_s.append(time.perf_counter() - start)
        return (Harness(graph_config, api=vllm_api),), {}

    def replay(harness: Any) -> None:
        start = time.perf_counter()
        _harness_replay(harness, trace.steps, results)
        graph_s.append(time.perf_counter() - start)

    benchmark.group = "cudagraph modes"
    benchmark.pedantic(replay, setup=setup, rounds=ROUNDS, iterations=1)
    assert [s.error for r in results for s in r.errors] == []
    modes = {r.get(obs.DISPATCH).fields["cg_mode"].values for r in results if r.get(obs.DISPATCH)}
    assert modes - {"NONE"}, f"{mode}: no step replayed a graph"
    ratio = statistics.median(graph_s) / statistics.median(eager_s)
    benchmark.extra_info.update(_trace_info(trace, vllm_api))
    benchmark.extra_info.update({"cudagraph_mode": mode, "graph_modes_seen": sorted(modes),
                                 "eager_median_ms": round(statistics.median(eager_s) * 1e3, 3),
                                 "graph_median_ms": round(statistics.median(graph_s) * 1e3, 3),
                                 "per_step_ratio_vs_eager": round(ratio, 4)})
    assert ratio > 0
