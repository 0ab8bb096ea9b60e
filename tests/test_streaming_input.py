"""Streaming input: a live request re-sent as new with its next input, in the valid contract.

vLLM's scheduler pauses a resumable request when its turn stops (it keeps its
runner slot and blocks) and re-sends it as a NewRequestData with the same id
once its next input arrives; ``GPUModelRunner.add_requests`` removes the old
state and re-adds it. These tests hold the trace format, the scheduler
contract, the scheduler model and the oracle to that.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from simrig.checks.lifecycle import SchedulerContract
from simrig.findings import findings as fk
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step, synth_token
from simrig.trace_io.trace import TraceError, read_trace
from simrig.trace_io.trace_format import parse_step
from simrig.trace_io.trace_writer import step_to_json
from strategies.machine import MachineSettings, SchedulerContractMachine
from strategies.model import PAUSED, STREAMED, Plan, Row, SchedulerModel, stream_token

CONFIG = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=4)
APPENDED = [900, 901, 902]


def session_steps() -> list[Step]:
    """a: a 5-token prompt, 2 outputs, its turn stops (not finished), then its next
    input of 3 tokens: prompt = 5 prompt + 1 kept output + 3 new = 9 tokens, from
    the 6 computed ones, over every block it holds. b runs beside it throughout."""
    head = [synth_token("a", p) for p in range(6)]
    return [
        Step(new_requests=[NewRequest("a", 5, max_tokens=2, block_ids=[1, 2]),
                           NewRequest("b", 3, max_tokens=4, block_ids=[3])],
             num_scheduled_tokens={"a": 5, "b": 3}),
        Step(cached=[CachedUpdate("a", 5), CachedUpdate("b", 3)], num_scheduled_tokens={"a": 1, "b": 1}),
        Step(cached=[CachedUpdate("b", 4)], num_scheduled_tokens={"b": 1}),
        Step(new_requests=[NewRequest("a", 9, num_computed_tokens=6, max_tokens=3,
                                      prompt_token_ids=head + APPENDED, block_ids=[1, 2, 4],
                                      streaming=True)],
             cached=[CachedUpdate("b", 5)], num_scheduled_tokens={"a": 3, "b": 1}),
        Step(cached=[CachedUpdate("a", 9)], num_scheduled_tokens={"a": 1}, finished=["b"]),
    ]


def write(tmp_path, steps: list[Step], adversarial: bool = False):
    path = tmp_path / "t.jsonl"
    header = {"format": "simrig-trace", "version": 1, "config": {"max_num_reqs": 4,
              "max_num_batched_tokens": 64, "max_model_len": 64, "block_size": 4},
              "source": {"kind": "hand-written"}, "adversarial": adversarial}
    path.write_text("\n".join([json.dumps(header)] + [json.dumps(step_to_json(s, i))
                                                      for i, s in enumerate(steps)]) + "\n")
    return path


# ------------------------------------------------------------------ trace format
def test_streaming_flag_round_trips_and_is_read(tmp_path):
    steps = session_steps()
    assert step_to_json(steps[3], 3)["new_requests"][0]["streaming"] is True
    assert "streaming" not in step_to_json(steps[0], 0)["new_requests"][0]
    _, read = read_trace(write(tmp_path, steps))
    assert [r.streaming for s in read for r in s.new_requests] == [False, False, True]
    assert read[3].new_requests[0] == steps[3].new_requests[0]


def test_streaming_flag_must_be_a_bool():
    with pytest.raises(TraceError, match=r"t:2: new_requests\[0\]\.streaming: must be true or false"):
        parse_step({"step": 0, "new_requests": [{"id": "a", "prompt_len": 3, "streaming": 1}],
                    "num_scheduled_tokens": {"a": 3}}, "t", 2)


def test_reader_keeps_a_duplicate_and_a_streaming_update_of_no_live_id_apart(tmp_path):
    steps = session_steps()
    dup = copy.deepcopy(steps[:4])
    dup[3].new_requests[0].streaming = False  # a live id sent as new without the flag
    with pytest.raises(TraceError, match=r":5: new_requests\[0\]\.id: duplicate new request id 'a'"):
        read_trace(write(tmp_path, dup))
    orphan = copy.deepcopy(steps[:4])
    orphan[3].finished = ["a"]  # finished first: nothing left to stream into
    with pytest.raises(TraceError, match=r":5: new_requests\[0\]\.streaming: a streaming update of 'a'"):
        read_trace(write(tmp_path, orphan))
    read_trace(write(tmp_path, dup, adversarial=True))  # adversarial traces carry the duplicate


# ------------------------------------------------------------------ the contract
def rules(steps: list[Step]) -> list[list[str]]:
    contract = SchedulerContract(CONFIG)
    return [[v.rule for v in contract.violations(s)] for s in steps]


def test_contract_accepts_a_streaming_update_and_keeps_the_duplicate():
    steps = session_steps()
    assert rules(steps) == [[]] * len(steps)
    dup = copy.deepcopy(steps)
    dup[3].new_requests[0].streaming = False
    assert rules(dup)[3] == ["duplicate_new_id"]


def test_contract_refuses_a_streaming_update_past_the_runners_count_or_of_no_live_id():
    ahead = copy.deepcopy(session_steps())
    ahead[3].new_requests[0].num_computed_tokens = 7  # the runner computed 6
    assert rules(ahead)[3][0] == "streaming_update"  # (and 7 + 3 overruns the 9-token prompt)
    behind = copy.deepcopy(session_steps())
    behind[3].new_requests[0].num_computed_tokens = 5  # a stop may trim: resumed from less
    assert rules(behind)[3] == []
    gone = copy.deepcopy(session_steps())
    gone[3].finished = ["a"]
    assert "streaming_update" in rules(gone)[3]


# ------------------------------------------------------------------ the model
def test_model_pauses_a_resumable_turn_and_sends_its_next_input_as_a_streaming_update():
    model = SchedulerModel(CONFIG)
    a = model.arrive(5, 2)
    model.build_step(Plan([Row(a, 5)]))  # prefill: 1 output
    model.stream_input(a, 3, 4)  # queued while the turn runs
    model.build_step(Plan([Row(a, 1)]))  # decode: 2 outputs, the turn stops
    req = model.reqs[a]
    assert req.state == STREAMED and not model.pending_finished
    assert model.free_slots() == CONFIG.max_num_reqs - 1  # the session keeps its slot
    step = model.build_step(Plan([Row(a, 2)]))  # a chunk of the new input
    (new,) = step.new_requests
    assert new.streaming and new.req_id == a and new.num_computed_tokens == 6
    assert new.prompt_len == 9 and new.prefill_len is None and new.max_tokens == 4
    ids = new.prefill_token_ids()
    assert ids[:6] == [synth_token(a, p) for p in range(6)]  # prompt + kept output
    assert ids[6:] == [stream_token(a, 1, p) for p in range(6, 9)]
    assert all(t != synth_token(a, p) for p, t in enumerate(ids) if p >= 6)
    assert new.block_ids == model.pool.blocks_of(a) and len(new.block_ids) == 2  # 8 tokens, 4 a block
    assert rules(model.steps) == [[]] * 3


def test_model_ends_a_paused_session_as_a_finish():
    model = SchedulerModel(CONFIG)
    a = model.arrive(3, 1)
    model.reqs[a].resumable = True
    model.build_step(Plan([Row(a, 3)]))
    assert model.reqs[a].state == PAUSED
    model.abort(a)
    step = model.build_step(Plan([]))
    assert step.finished == [a] and model.free_slots() == CONFIG.max_num_reqs


def test_valid_machine_sends_streaming_updates_within_its_first_examples():
    """The valid campaign's own rules draw streaming updates early (steps only, no vLLM)."""
    seen = {"steps": 0, "streaming": 0, "violations": 0}

    class Counting(SchedulerContractMachine.bind(MachineSettings())):
        def _send(self, step: Step, violation: str | None) -> None:
            if not self.steps:
                self.contract = SchedulerContract(self.config)
            self.steps.append(step)
            seen["violations"] += len(self.contract.violations(step))
            seen["steps"] += 1
            seen["streaming"] += sum(r.streaming for r in step.new_requests)

    run_state_machine_as_test(Counting, settings=settings(
        max_examples=40, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(HealthCheck)))
    assert seen["streaming"] >= 3 and seen["violations"] == 0


# ------------------------------------------------------------------ real vLLM
@pytest.fixture(scope="module")
def run(vllm_api):
    from simrig.harness import Harness

    harness = Harness(CONFIG, api=vllm_api)
    steps = session_steps()
    return steps, [harness.run_step(s) for s in steps]


def check_all(steps, observations):
    from simrig.checks.checker import Checker

    checker = Checker(CONFIG, trace="test")
    return [f for i, (s, o) in enumerate(zip(steps, observations)) for f in checker.check(i, s, o)]


@pytest.mark.vllm
def test_real_runner_takes_the_streaming_update_cleanly(run):
    steps, observations = run
    assert [f.one_line() for f in check_all(steps, observations) if not f.known] == []
    life = observations[3].get("lifecycle").fields
    assert life["runner.added.req_ids"].values == ["a"]
    assert life["runner.added.token_ids"].values[0][6:] == APPENDED
    assert life["runner.added.num_computed"].values == [6]
    assert life["runner.added.num_blocks"].values == [[3]]
    prepare = observations[3].get("prepare")
    order = [str(r) for r in prepare.fields["req_ids"].values]
    ids = np.asarray(prepare.fields["input_ids"].values)
    start = 0 if order[0] == "a" else 1  # a's 3 tokens follow b's decode in the batch order
    assert ids[start:start + 3].tolist() == APPENDED


def _corrupt(observations, index, fn):
    out = list(observations)
    out[index] = copy.deepcopy(observations[index])
    fn(out[index])
    return out


@pytest.mark.vllm
@pytest.mark.parametrize("corruption, check, field", [
    ("old_prompt", "reference", "input_ids"),
    ("old_computed", "reference", "num_computed_tokens_np"),
    ("old_blocks", "blocks", "attn.block_tables.0"),
    ("slot_lost", "runner_state", "runner.free_slots"),
    ("kept_prompt_len", "readded", "runner.added.prompt_len"),
    ("kept_token_row", "readded", "runner.added.token_ids"),
    ("appended_block_row", "readded", "runner.added.num_blocks"),
])
def test_a_stale_re_added_state_is_caught(run, corruption, check, field):
    """What add_requests would leave with the old state in place: the old prompt's
    tokens, the old computed count, the old block row, the old slot never freed."""
    steps, observations = run
    a_row = [str(r) for r in observations[3].get("prepare").fields["req_ids"].values].index("a")

    def corrupt(obs):
        prepare, life = obs.get("prepare"), obs.get("lifecycle")

        def put(stage, name, fn):
            f = stage.fields[name]
            values = copy.deepcopy(f.values)
            stage.fields[name] = dataclasses.replace(f, values=fn(np.array(values)))

        first = int(prepare.fields["query_start_loc_np"].values[a_row])
        if corruption == "old_prompt":
            def old(v):
                v[first:first + 3] = [synth_token("a", p) for p in range(6, 9)]
                return v
            put(prepare, "input_ids", old)
        elif corruption == "old_computed":
            def old(v):
                v[a_row] = 5
                return v
            put(prepare, "num_computed_tokens_np", old)
        elif corruption == "old_blocks":
            def old(v):
                v[a_row, 2] = 0
                return v
            put(prepare, "attn.block_tables.0", old)
        elif corruption == "slot_lost":
            put(life, "runner.free_slots", lambda v: v[:-1])
        elif corruption == "kept_prompt_len":
            put(life, "runner.added.prompt_len", lambda v: [5])
        elif corruption == "kept_token_row":
            put(life, "runner.added.token_ids", lambda v: [[synth_token("a", p) for p in range(9)]])
        else:  # the new list appended to the old row: 2 + 3 blocks
            put(life, "runner.added.num_blocks", lambda v: [[5]])

    found = [f for f in check_all(steps, _corrupt(observations, 3, corrupt)) if not f.known]
    assert any(f.check == check and f.field == field and f.step == 3 for f in found), \
        [f.one_line() for f in found]
    assert fk.VALUE_MISMATCH in {f.kind for f in found}


# ------------------------------------------------------------------ vLLM's own scheduler
@pytest.mark.vllm
def test_vllms_scheduler_re_sends_a_streaming_session_as_the_trace_says(vllm_api):
    """vLLM's real scheduler, a resumable request: its turn stops, its next input is added
    with the same id, and the next schedule() sends it as new with its live id. The Step
    recorded from that output is a streaming update of exactly the documented shape, it
    keeps the contract, and the real runner takes it with no finding but known ones."""
    from simrig.checks.checker import Checker
    from simrig.harness import Harness
    from simrig.vllm_parts.scheduler import RealScheduler, SchedulerSetup

    setup = SchedulerSetup(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128,
                           num_kv_blocks=32, prefix_caching=False, block_size=16)
    sched = RealScheduler(setup)
    prompt = [synth_token("s", p) for p in range(20)]
    sched.add("s", prompt, max_tokens=3, resumable=True)
    steps = []
    for _ in range(3):  # prefill, then two decodes: the third output stops the turn
        step, so = sched.schedule()
        steps.append(step)
        sched.complete(so, {r: [synth_token(r, sched.progress(r)[1])] for r in so.num_scheduled_tokens})
    held = sched.scheduler.requests["s"]
    assert not held.is_finished() and held.num_computed_tokens == 22  # 20 prompt + 2 outputs fed back
    sched.add("s", APPENDED, max_tokens=2, resumable=True)  # the next input, same id
    step, so = sched.schedule()
    steps.append(step)
    (new,) = step.new_requests
    assert new.streaming and new.req_id == "s" and not step.finished
    assert new.num_computed_tokens == 22 and new.prompt_len == 22 + len(APPENDED)
    assert new.prefill_len is None  # vLLM's prefill tokens are the (extended) prompt
    assert new.prompt_token_ids[22:] == APPENDED  # kept tokens, then the new input
    assert new.block_ids[:len(steps[0].new_requests[0].block_ids)] == steps[0].new_requests[0].block_ids
    assert step.num_scheduled_tokens == {"s": len(APPENDED)}
    config = setup.runner_config()
    contract = SchedulerContract(config)
    assert [v for s in steps for v in contract.violations(s)] == []
    harness, checker = Harness(config, api=vllm_api), Checker(config, trace="scheduler")
    found = [f for i, s in enumerate(steps) for f in checker.check(i, s, harness.run_step(s))]
    assert [f.one_line() for f in found if not f.known] == []
