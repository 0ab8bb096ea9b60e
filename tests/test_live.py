"""Live recording hook on the real scheduler path: files appear, rotate, replay."""

from __future__ import annotations

import gzip

import pytest

from simrig.replay import replay_problems as replay_errors
from simrig.sources import live
from simrig.sources.record import continuity_problems, record, stats_of
from simrig.sources.sampler import SyntheticSampler
from simrig.sources.workloads import parse_spec
from simrig.step import NewRequest, Step
from simrig.trace_io.trace import TraceReader, step_to_json
from simrig.vllm_parts.scheduler import STOP_TOKEN_ID, RealScheduler, SchedulerSetup

SETUP = SchedulerSetup(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=512,
                       num_kv_blocks=40, num_speculative_tokens=2)
SPEC = "synthetic:requests=16,rate=50,prompt=16-160,output=4-40,shared_prefix=0.3,prefix_len=48"


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """Drive the real scheduler with the hook attached to its instance;
    also keep every step as the record loop saw it."""
    directory = tmp_path_factory.mktemp("live")
    scheduler = RealScheduler(SETUP)
    recorder = live.recorder_for(scheduler.scheduler, str(directory), max_mb=4 / 1024, max_files=100)
    live.attach(scheduler.scheduler, recorder)
    seen: list[Step] = []
    sampler = SyntheticSampler(seed=2, acceptance_rate=0.6, stop_token_id=STOP_TOKEN_ID,
                               num_speculative_tokens=2)
    record(scheduler, parse_spec(SPEC), sampler, seen.append, max_steps=150)
    live.detach(scheduler.scheduler)
    return directory, recorder, seen


def _parts(directory):
    return sorted(directory.glob("sched-*.jsonl.gz"))


def test_files_appear_rotate_and_parse_strictly(live_run):
    directory, recorder, seen = live_run
    parts = _parts(directory)
    assert len(parts) >= 3  # 4 KB per part
    assert not list(directory.glob(".tmp-*"))  # every part closed atomically
    for i, path in enumerate(parts):
        reader = TraceReader(path)
        assert reader.header.source["tool"] == "simrig live"
        assert reader.header.source["part"] == i
        assert reader.header.config == SETUP.runner_config()
        assert sum(1 for _ in reader) >= 1


def test_parts_hold_exactly_the_scheduled_steps_with_rejections(live_run):
    directory, _, seen = live_run
    written = []
    for path in _parts(directory):
        reader = TraceReader(path)
        steps = [s for _, s in reader]
        if "resync_step" in reader.header.source:
            assert not steps[0].num_scheduled_tokens
            steps = steps[1:]
        written += steps
    # The record loop skips steps that schedule nothing and finish nothing;
    # the hook writes every schedule() call.
    useful = [s for s in written if s.num_scheduled_tokens or s.finished or s.preempted]

    def plain(step):  # live traces never carry prompt token ids
        d = step_to_json(step, 0)
        for r in d.get("new_requests", []):
            r.pop("token_ids", None)
        return d

    assert [plain(s) for s in useful] == [plain(s) for s in seen]
    assert stats_of(useful).rejected_tokens >= 1
    assert continuity_problems(written) == []


def test_no_prompt_token_ids_are_written(live_run):
    directory, _, seen = live_run
    assert any(r.prompt_token_ids for s in seen for r in s.new_requests)  # shared prefixes exist
    for path in _parts(directory):
        assert b'"token_ids"' not in gzip.decompress(path.read_bytes())


def test_every_part_replays_clean_on_its_own(live_run, vllm_api):
    directory, _, _ = live_run
    parts = _parts(directory)
    resynced = [p for p in parts if "resync_step" in TraceReader(p).header.source]
    assert resynced, "a later part must start from a resync step"
    for path in (parts[0], resynced[len(resynced) // 2]):
        reader = TraceReader(path)
        steps = [s for _, s in reader]
        assert replay_errors(reader.header, steps, vllm_api) == [], path.name


def test_rotation_keeps_at_most_max_files(tmp_path):
    writer = live.RotatingTraceWriter(tmp_path, SETUP.runner_config(), {"kind": "recorded"},
                                      max_bytes=1, max_files=2, stem="t")
    for i in range(5):
        writer.write(Step(new_requests=[NewRequest(f"r{i}", 4)], num_scheduled_tokens={f"r{i}": 4}))
    writer.close()
    assert [p.name for p in sorted(tmp_path.glob("t-*"))] == ["t-0003.jsonl.gz", "t-0004.jsonl.gz"]
    steps = [s for _, s in TraceReader(tmp_path / "t-0004.jsonl.gz")]
    # resync: r0..r3 are still held by the runner (never finished)
    assert [r.req_id for r in steps[0].new_requests] == ["r0", "r1", "r2", "r3"]
    assert [r.num_computed_tokens for r in steps[0].new_requests] == [4, 4, 4, 4]


def test_plugin_entry_point_records_new_schedulers_only_when_enabled(tmp_path, monkeypatch):
    monkeypatch.delenv(live.ENV_DIR, raising=False)
    live.register()
    assert not getattr(RealScheduler(SETUP).scheduler, "_simrig_recorder", None)
    monkeypatch.setenv(live.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(live.ENV_MAX_MB, "1")
    live.register()
    try:
        scheduler = RealScheduler(SETUP)
        assert scheduler.scheduler._simrig_recorder.writer.max_bytes == 1024 * 1024
        sampler = SyntheticSampler(stop_token_id=STOP_TOKEN_ID, num_speculative_tokens=2)
        record(scheduler, parse_spec("synthetic:requests=4,prompt=8-32,output=2-6"), sampler,
               lambda step: None, max_steps=40)
        live.detach(scheduler.scheduler)
    finally:
        live.unregister()
    assert not getattr(RealScheduler(SETUP).scheduler, "_simrig_recorder", None)
    (path,) = _parts(tmp_path)
    assert stats_of(s for _, s in TraceReader(path)).finished == 4


def test_a_recorder_error_disables_recording_but_not_the_scheduler(tmp_path):
    scheduler = RealScheduler(SETUP)
    recorder = live.recorder_for(scheduler.scheduler, str(tmp_path))

    def broken(so):
        raise RuntimeError("disk full")

    recorder.on_schedule = broken
    live.attach(scheduler.scheduler, recorder)
    sampler = SyntheticSampler(stop_token_id=STOP_TOKEN_ID)
    result = record(scheduler, parse_spec("synthetic:requests=2,prompt=8,output=2"), sampler,
                    lambda step: None)
    assert result.stats.finished == 2 and recorder.disabled
