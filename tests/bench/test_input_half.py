"""Real code: the cost of running execute_model's whole input half per step.

simrig drives each step through the installed ``GPUModelRunner.execute_model``
(lifecycle, gather, dispatch, prepare, partition, prepare_attn's block tables
and slot mappings, the stand-in forward) plus every other PCP rank's
partition. Before, it called only the input functions themselves:

    input half:  execute_model(so)  + partition_batch of PCP ranks 1..P-1
    bare calls:  finish/add/update -> gather_batch_req_state -> dispatch
                 -> prepare_inputs (no PCP manager set) -> partition_batch per rank

Both run bare (no probes, no observation copies) on fresh runners over the
bench trace, interleaved round by round so both see the same load.
``extra_info["input_half_ratio"]`` = median input-half replay / median bare
replay; the target is at most ``TARGET_RATIO`` (reported as
``target_met``, never asserted: timing is the benchmark's to show, not a
test's to gate).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import pytest

from simrig.vllm_parts import cudagraph

pytestmark = [pytest.mark.bench, pytest.mark.vllm]

ROUNDS = int(os.environ.get("SIMRIG_BENCH_ROUNDS", "5"))
TARGET_RATIO = 1.5


def _fresh(api: Any, config: Any) -> tuple[Any, list[Any]]:
    tables = api.build_block_tables(config)
    managers = api.build_pcp_managers(config, tables)
    runner = api.build_runner(config, api.build_dispatcher(config),
                              managers[0] if managers else None, tables)
    return runner, managers


def _bare_calls(api: Any, config: Any, steps: list) -> float:
    runner, managers = _fresh(api, config)
    runner.pcp_manager = None  # prepare_inputs returns the global batch
    start = time.perf_counter()
    for step in steps:
        so = api.scheduler_output(step)
        runner.finish_requests(so)
        runner.add_requests(so)
        runner.update_requests(so)
        if not step.num_scheduled_tokens:
            continue
        runner.pcp_manager = managers[0] if managers else None
        batch_state, uniform = runner.gather_batch_req_state(so, False)
        num_tokens = batch_state.num_tokens
        if managers:
            num_tokens = managers[0].get_num_tokens_for_dispatch(
                batch_state.num_scheduled_tokens, batch_state.is_prefilling_np)
        runner.pcp_manager = None
        desc = cudagraph.dispatch(
            runner.cudagraph_manager, num_reqs=len(step.num_scheduled_tokens),
            num_tokens=num_tokens, uniform_token_count=uniform,
            max_query_len=None, decode_query_len=config.decode_query_len)
        batch = runner.prepare_inputs(so, batch_state, desc, 0)
        for manager in managers:
            api.partition_for_rank(manager, batch, desc)
    return time.perf_counter() - start


def _input_half(api: Any, config: Any, steps: list) -> float:
    runner, managers = _fresh(api, config)
    seen: dict[str, Any] = {}
    manager_cls = type(runner.cudagraph_manager)
    dispatcher = runner.cudagraph_manager

    def dispatch(*args: Any, **kwargs: Any) -> Any:  # the step's descriptor, for ranks past 0
        seen["desc"] = manager_cls.dispatch(dispatcher, *args, **kwargs)
        return seen["desc"]

    dispatcher.dispatch = dispatch
    if managers:  # the global batch rank 0 partitions, for the other ranks
        owner, partition_cls = managers[0], type(managers[0])

        def partition(batch: Any, *args: Any, **kwargs: Any) -> Any:
            seen["batch"] = batch
            return partition_cls.partition_batch(owner, batch, *args, **kwargs)

        owner.partition_batch = partition
    start = time.perf_counter()
    for step in steps:
        seen.clear()
        runner.execute_model(api.scheduler_output(step))
        runner.execute_model_state = None
        if "batch" in seen:
            for manager in managers[1:]:
                api.partition_for_rank(manager, seen["batch"], seen["desc"])
    return time.perf_counter() - start


@pytest.mark.parametrize("pcp_size", [1, 2], ids=lambda p: f"pcp{p}")
def test_input_half_cost(benchmark, vllm_api, bench_trace, pcp_size: int) -> None:
    trace = bench_trace.with_pcp(pcp_size)
    bare_s: list[float] = []
    half_s: list[float] = []

    def setup() -> tuple[tuple, dict]:
        bare_s.append(_bare_calls(vllm_api, trace.config, trace.steps))
        return (), {}

    def replay() -> None:
        half_s.append(_input_half(vllm_api, trace.config, trace.steps))

    benchmark.group = "input half"
    benchmark.pedantic(replay, setup=setup, rounds=ROUNDS, iterations=1)
    assert len(bare_s) == len(half_s) >= 1
    bare, half = statistics.median(bare_s), statistics.median(half_s)
    ratio = half / bare
    benchmark.extra_info.update({
        "trace": trace.name, "steps": len(trace.steps), "pcp_size": pcp_size,
        "vllm": vllm_api.version, "bare_calls_median_ms": round(bare * 1e3, 3),
        "input_half_median_ms": round(half * 1e3, 3),
        "per_step_bare_ms": round(bare * 1e3 / len(trace.steps), 4),
        "per_step_input_half_ms": round(half * 1e3 / len(trace.steps), 4),
        "input_half_ratio": round(ratio, 4), "target_ratio": TARGET_RATIO,
        "target_met": ratio <= TARGET_RATIO})
    assert bare > 0 and half > 0
