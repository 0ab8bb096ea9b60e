"""Recording speed: scheduler steps per second through vLLM's real Scheduler.

Each round builds a fresh scheduler (untimed setup; the engine config is
cached per process) and times the record loop alone:

    round:  add arrivals -> schedule() -> synthetic sampler
            -> update_from_output() -> drafts -> Step -> sink (in memory)

``extra_info["steps_per_s"]`` is the median steps per second; the mean batch
size goes along so figures from different machines can be compared.
"""

from __future__ import annotations

import statistics

import pytest

from simrig.sources.record import record
from simrig.sources.sampler import SyntheticSampler
from simrig.sources.workloads import parse_spec
from simrig.vllm_parts.scheduler import STOP_TOKEN_ID, RealScheduler, SchedulerSetup

STEPS = 200
CASES = {
    "decode-heavy": (SchedulerSetup(max_num_seqs=32, max_num_batched_tokens=512, max_model_len=2048,
                                    num_kv_blocks=1024),
                     "synthetic:requests=96,rate=0,prompt=32-256,output=64-256"),
    "spec-preempt": (SchedulerSetup(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1024,
                                    num_kv_blocks=96, num_speculative_tokens=3),
                     "synthetic:requests=64,rate=0,prompt=32-256,output=32-128,shared_prefix=0.3"),
}


@pytest.mark.bench
@pytest.mark.parametrize("case", sorted(CASES))
def test_record_steps_per_second(benchmark, case):
    setup, spec = CASES[case]
    workload = parse_spec(spec)
    RealScheduler(setup)  # pay the engine-config cost outside the rounds
    rates, batch = [], []

    def make_round():
        scheduler = RealScheduler(setup)
        sampler = SyntheticSampler(seed=0, acceptance_rate=0.7, stop_token_id=STOP_TOKEN_ID,
                                   num_speculative_tokens=setup.num_speculative_tokens)
        return (scheduler, workload, sampler, lambda step: None), {"max_steps": STEPS}

    def one_round(scheduler, workload, sampler, sink, max_steps):
        result = record(scheduler, workload, sampler, sink, max_steps=max_steps)
        rates.append(result.stats.steps / result.scheduler_s)
        batch.append(result.stats.scheduled_tokens / max(result.stats.steps, 1))
        return result

    result = benchmark.pedantic(one_round, setup=make_round, rounds=3, iterations=1)
    assert result.stats.steps == STEPS
    benchmark.extra_info["steps_per_s"] = round(statistics.median(rates), 1)
    benchmark.extra_info["mean_tokens_per_step"] = round(statistics.median(batch), 1)
