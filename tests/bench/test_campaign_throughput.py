"""Campaign throughput: machine steps per second through the real code (CPU: Triton interpreter)."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from simrig.step import RunnerConfig
from strategies import MachineSettings, SchedulerContractMachine

pytestmark = [pytest.mark.bench, pytest.mark.vllm]

CONFIG = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256,
                      num_speculative_tokens=2, pcp_size=2)


@pytest.mark.parametrize("stages", [("gather",), ("gather", "prepare", "partition", "dummy")],
                         ids=["gather-only", "all-stages"])
def test_campaign_steps_per_second(benchmark, stages):
    from simrig.adapters.runner import load

    load()
    counted = {"steps": 0}

    def on_step(machine, index, step, obs, found):
        counted["steps"] += 1
        return []

    machine = SchedulerContractMachine.bind(MachineSettings(
        configs=st.just(CONFIG), stages=stages, on_step=on_step))
    run_settings = settings(max_examples=5, stateful_step_count=20, deadline=None, database=None,
                            derandomize=True, phases=[Phase.generate],
                            suppress_health_check=list(HealthCheck))

    round_s: list[float] = []

    def campaign():
        # Timed here too: the benchmark's own stats are absent under
        # --benchmark-disable, which runs one round.
        start = time.perf_counter()
        run_state_machine_as_test(machine, settings=run_settings)
        round_s.append(time.perf_counter() - start)

    benchmark.pedantic(campaign, rounds=2, iterations=1)
    assert round_s and counted["steps"] > 0
    benchmark.extra_info["steps_per_round"] = counted["steps"] / len(round_s)
    benchmark.extra_info["steps_per_s"] = counted["steps"] / sum(round_s)
