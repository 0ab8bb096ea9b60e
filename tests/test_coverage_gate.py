"""Coverage's gate: what a gated collector traces, and which kernel launches it samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig import trace_gate as gate
from simrig.coverage.collect import Collector

BUFFER_UTILS = "vllm/v1/worker/gpu/buffer_utils.py"


def traced_indices(sampler: gate.LaunchSampler, launches: int, adds_at: frozenset[int] = frozenset()) -> list[int]:
    traced = []
    for i in range(launches):
        if sampler.wants("k"):
            traced.append(i)
            sampler.traced("k", i in adds_at)
    return traced


def test_a_dry_kernel_is_traced_ever_more_rarely_up_to_the_cap():
    sampler = gate.LaunchSampler()
    # gaps 1, 2, 4, 8, 16, then 32 (MAX_SKIP) for good
    assert traced_indices(sampler, 110) == [0, 2, 5, 10, 19, 36, 69, 102]
    assert sampler.traced_launches == 8 and sampler.skipped_launches == 102


def test_a_launch_that_adds_arcs_brings_the_next_launch_back():
    sampler = gate.LaunchSampler()
    # launch 10 is traced (gap 4 after launch 5) and adds arcs: 11 is traced, then the gaps start over
    assert traced_indices(sampler, 20, adds_at=frozenset({10})) == [0, 2, 5, 10, 11, 13, 16]


def test_kernels_are_sampled_apart():
    sampler = gate.LaunchSampler()
    assert sampler.wants("a")
    sampler.traced("a", False)
    assert not sampler.wants("a")
    assert sampler.wants("b")  # another kernel (or specialisation) starts fresh


@pytest.mark.vllm
def test_a_gated_collector_traces_only_inside_vllm_regions(vllm_api):
    from vllm.v1.worker.gpu import buffer_utils

    with Collector() as collector:
        buffer_utils._num_write_chunks(4096)  # the rig calling vLLM code: not measured
        assert BUFFER_UTILS not in collector.data()
        with gate.vllm_calls():
            with gate.rig_work():  # a probe's bookkeeping inside a step
                buffer_utils._num_write_chunks(4096)
            assert BUFFER_UTILS not in collector.data()
            buffer_utils._num_write_chunks(4096)
        assert collector.data()[BUFFER_UTILS]
    assert gate.ACTIVE is None

    with Collector(gated=False) as everything:
        buffer_utils._num_write_chunks(4096)
    assert everything.data()[BUFFER_UTILS]


@pytest.mark.vllm
def test_take_hands_out_each_arc_once_and_data_keeps_them_all(vllm_api):
    from vllm.v1.worker.gpu import buffer_utils

    with Collector(gated=False) as collector:
        assert collector.take() == {}
        buffer_utils._num_write_chunks(4096)
        first = collector.take()
        buffer_utils._num_write_chunks(4096)  # the same arcs again: nothing fresh
        assert collector.take() == {}
    assert first[BUFFER_UTILS]
    assert collector.data() == first


@pytest.mark.vllm
def test_sampled_launches_reach_nearly_every_arc_of_tracing_them_all(vllm_api):
    """A replay measured with every launch traced and with launches sampled:
    the sampled arcs are a subset, missing at most 1 % of them."""
    from simrig.replay import replay_traces

    traces = sorted(Path("traces/samples").glob("*.jsonl"))
    replay_traces(traces)  # warm: first-call-only code runs before either measurement

    def measure(sampled: bool) -> tuple[set, Collector]:
        collector = Collector()
        if not sampled:
            collector.launches.wants = lambda kernel: True  # type: ignore[method-assign]
        with collector:
            replay_traces(traces)
        return {(path, arc) for path, arcs in collector.data().items() for arc in arcs}, collector

    every, _ = measure(sampled=False)
    sampled, collector = measure(sampled=True)
    assert collector.launches.skipped_launches > collector.launches.traced_launches
    assert sampled <= every
    assert len(every - sampled) <= 0.01 * len(every)
