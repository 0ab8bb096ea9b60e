"""LoRA ids through the recorders: ``simrig record`` (the real scheduler and a workload)
and the live hook (SIMRIG_RECORD) write each new request's adapter into the trace."""

from __future__ import annotations

import pytest

from simrig.sources import live
from simrig.sources.record import record, record_to_file
from simrig.sources.sampler import SyntheticSampler
from simrig.sources.workloads import WorkloadRequest, assign_adapters, parse_spec
from simrig.step import Step
from simrig.trace_io.trace import TraceReader
from simrig.vllm_parts.scheduler import STOP_TOKEN_ID, RealScheduler, SchedulerSetup, runner_config_of

SETUP = SchedulerSetup(max_num_seqs=3, max_num_batched_tokens=128, max_model_len=256, num_kv_blocks=64,
                       max_loras=2)


def _adapters(steps) -> dict[str, int | None]:
    return {r.req_id: r.lora_id for s in steps for r in s.new_requests}


def test_adapters_are_seeded_and_cover_the_base_model_and_every_id():
    reqs = [WorkloadRequest(f"r{i}", 0.0, 8, 4) for i in range(60)]
    assign_adapters(reqs, 4, seed=3)
    ids = [r.lora_id for r in reqs]
    assert set(ids) == {None, 1, 2, 3, 4}
    again = [WorkloadRequest(f"r{i}", 0.0, 8, 4) for i in range(60)]
    assign_adapters(again, 4, seed=3)
    assert [r.lora_id for r in again] == ids


@pytest.mark.vllm
def test_the_real_scheduler_hands_each_new_request_its_adapter():
    scheduler = RealScheduler(SETUP)
    assert runner_config_of(scheduler.scheduler).max_loras == 2
    for i, lora in enumerate((1, 2, 3, None)):
        scheduler.add(f"q{i}", list(range(1, 9)), 4, lora_id=lora)
    step, _ = scheduler.schedule()
    adapters = _adapters([step])
    # vLLM's scheduler keeps a batch within max_loras adapters: q2 (a third one) waits
    assert adapters == {"q0": 1, "q1": 2, "q3": None}


@pytest.mark.vllm
def test_record_writes_the_adapters_and_max_loras(tmp_path):
    path = tmp_path / "lora.jsonl"
    reqs = parse_spec("synthetic:requests=12,prompt=8-40,output=2-8")
    record_to_file(str(path), SETUP, reqs, spec="synthetic", seed=5, acceptance_rate=0.7, eos_prob=0.0)
    reader = TraceReader(path)
    assert reader.header.config.max_loras == 2 and reader.header.source["lora_adapters"] == 4
    written = _adapters(s for _, s in reader)
    assert written == {r.req_id: r.lora_id for r in reqs}  # every request's own adapter
    assert None in written.values() and len(set(written.values()) - {None}) >= 2


@pytest.mark.vllm
def test_the_live_hook_records_the_adapters(tmp_path):
    scheduler = RealScheduler(SETUP)
    recorder = live.recorder_for(scheduler.scheduler, str(tmp_path))
    live.attach(scheduler.scheduler, recorder)
    reqs = parse_spec("synthetic:requests=8,prompt=8-40,output=2-8")
    assign_adapters(reqs, 4, seed=1)
    seen: list[Step] = []
    record(scheduler, reqs, SyntheticSampler(stop_token_id=STOP_TOKEN_ID), seen.append, max_steps=60)
    live.detach(scheduler.scheduler)
    (path,) = sorted(tmp_path.glob("sched-*.jsonl.gz"))
    reader = TraceReader(path)
    assert reader.header.config.max_loras == 2
    assert _adapters(s for _, s in reader) == _adapters(seen) == {r.req_id: r.lora_id for r in reqs}
