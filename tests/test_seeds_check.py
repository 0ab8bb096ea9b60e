"""The seeds check (simrig/sampling_checks/seeds.py): the solo schedule a seeded request
replays on, what a run's record keeps, and a difference found (a stand-in runner; and the
real one with each request's stream keyed by its slot instead of its seed)."""

from __future__ import annotations

import pytest

from simrig import observe as obs
from simrig.findings import findings as fk
from simrig.replay import run_steps
from simrig.sampling.params import SamplingSpec
from simrig.sampling_checks.seeds import FIELD, PLACEHOLDER, SeedsRecord, solo_steps
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceHeader

CONFIG = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=8, max_model_len=64, block_size=16)
SEEDED = SamplingSpec(temperature=0.7, seed=5)


def test_the_solo_schedule_chunks_the_prompt_then_decodes_one_token_a_step():
    req = NewRequest("s", 19, max_tokens=9, sampling=SEEDED, block_ids=[7])
    steps = solo_steps(CONFIG, req, 3)
    assert [s.num_scheduled_tokens for s in steps] == [{"s": 8}, {"s": 8}, {"s": 3}, {"s": 1}, {"s": 1}]
    assert [[c.num_computed_tokens for c in s.cached] for s in steps] == [[], [8], [16], [19], [20]]
    first = steps[0].new_requests[0]
    assert (first.req_id, first.prompt_len, first.sampling, first.max_tokens) == ("s", 19, SEEDED, 9)
    assert first.block_ids == [1, 2, 3, 4]  # every block up to max_model_len, past the null block 0


def test_the_shifted_solo_schedule_lets_a_placeholder_take_the_first_slot():
    steps = solo_steps(CONFIG, NewRequest("s", 10, sampling=SEEDED), 2, shift=True)
    assert [r.req_id for r in steps[0].new_requests] == [PLACEHOLDER, "s"]
    assert steps[0].new_requests[1].block_ids == [1, 2, 3, 4] and steps[0].new_requests[0].block_ids == [5]
    assert [s.num_scheduled_tokens for s in steps] == [{PLACEHOLDER: 1, "s": 7}, {"s": 3}, {"s": 1}]
    assert steps[1].finished == [PLACEHOLDER]


def _obs(index: int, handed: dict[str, list[int]], slots: dict[str, int]) -> obs.StepObs:
    post = obs.StageObs(obs.POSTPROCESS, fields={
        "output.req_ids": obs.observe_value(list(handed)),
        "output.sampled_token_ids": obs.observe_value(list(handed.values()))})
    life = obs.StageObs(obs.LIFECYCLE, fields={
        "runner.live_ids": obs.observe_value(list(slots)),
        "runner.live_slots": obs.observe_value(list(slots.values()))})
    return obs.StepObs(index=index, stages=[life, post])


class _Runners:
    """Stand-in pool: its runner hands ``tokens`` out, one a step once the prompt is done."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.schedules = tokens, []

    def acquire(self, config, stages):
        runners = self

        class Runner:
            def run_step(self, step):
                runners.schedules[-1].append(step)
                req = step.req_ids[-1]
                done = len(runners.schedules[-1]) - 1
                return _obs(done, {req: [runners.tokens[done]]}, {})

        self.schedules.append([])
        return Runner()

    def release(self, harness):
        return True


def _run() -> tuple[SeedsRecord, list[Step]]:
    """u (no parameters) then s (seeded) at once, s in the runner's slot 2; two decodes."""
    steps = [Step(new_requests=[NewRequest("u", 4), NewRequest("s", 4, sampling=SEEDED)],
                  num_scheduled_tokens={"u": 4, "s": 4})]
    steps += [Step(cached=[CachedUpdate("u", 4 + k), CachedUpdate("s", 4 + k)],
                   num_scheduled_tokens={"u": 1, "s": 1}) for k in range(2)]
    record = SeedsRecord(CONFIG)
    for i, (step, given) in enumerate(zip(steps, ([40, 11], [41, 12], [42, 13]))):
        record.observe(i, step, _obs(i, {"u": [given[0]], "s": [given[1]]}, {"u": 3, "s": 2}))
    return record, steps


def test_a_seeded_request_given_other_tokens_alone_is_a_finding():
    record, _ = _run()
    assert [(life.first.req_id, life.tokens, life.slots) for life in record.lives()] == [
        ("s", [(0, 11), (1, 12), (2, 13)], {2})]
    runners = _Runners([11, 12, 99])
    (f,) = record.check(runners, ())
    assert (f.kind, f.stage, f.field, f.step, f.req_ids) == (
        fk.VALUE_MISMATCH, obs.POSTPROCESS, FIELD, 2, ("s",))
    assert (f.expected, f.actual) == ("[2] = 99 (as replayed alone)", "[2] = 13 (in the run)")
    assert "seed 5" in f.message and "gumbel_noised_argmax" in f.message
    assert [s.num_scheduled_tokens for s in runners.schedules[0]] == [{"s": 4}, {"s": 1}, {"s": 1}]
    assert record.check(_Runners([11, 12, 13]), ()) == []


def test_a_run_ending_in_a_failed_step_is_not_replayed():
    record, steps = _run()
    failed = _obs(3, {}, {})
    failed.stages[0].error = obs.ErrorObs("RuntimeError", "boom", ())
    record.observe(3, Step(), failed)
    assert record.lives() == [] and record.spoilt


@pytest.mark.vllm
def test_a_stream_keyed_by_slot_is_found_by_a_replay(vllm_api, seed_keyed_by_slot):
    """The real runner: two seeded requests side by side, once as vLLM keys them, once with
    each request's stream keyed by its slot (the seeded fault of the catalogue's
    seed-stream-keyed-by-slot)."""
    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=32, max_model_len=64)
    arrivals = [NewRequest(r, 6, sampling=SamplingSpec(temperature=1.3, seed=s), block_ids=[i + 1])
                for i, (r, s) in enumerate((("a", 3), ("b", 4)))]
    steps = [Step(new_requests=arrivals, num_scheduled_tokens={"a": 6, "b": 6})]
    steps += [Step(cached=[CachedUpdate(r, 6 + k) for r in "ab"], num_scheduled_tokens={"a": 1, "b": 1})
              for k in range(3)]

    def seeds_found() -> list:
        return [f for r in run_steps(TraceHeader(config=config), enumerate(steps), api=vllm_api)
                for f in r.findings if f.field == FIELD]

    assert seeds_found() == []
    seed_keyed_by_slot()
    found = seeds_found()
    assert found and {f.req_ids for f in found} <= {("a",), ("b",)}
