"""A crash class's example is shrunk by replays in forked children (simrig.supervision.crash_shrink).

The fast tests replace the replay in the child by a stand-in that reads the trace as the replay
does and dies of a real SIGSEGV, in stage lifecycle, where a seeded fault would: at the first
decode of request ``p``, or as soon as the runner holds four requests. The slow test seeds that
second fault into vLLM's own add_requests (``FOURTH_HELD``), in each child only. Every expected
shrunk schedule follows from the fault and the schedule built here.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from simrig import lifeline
from simrig.campaign import shrink
from simrig.campaign.options import CampaignOptions, FindingClass
from simrig.checks.lifecycle import SchedulerContract
from simrig.findings.findings import Finding
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.supervision.crash_shrink import (
    MAX_REPLAYS,
    CrashShrinker,
    request_ids,
    shrink_crash_classes,
    without_request,
    without_step,
)
from simrig.trace_io.trace import read_trace, write_trace
from simrig.vllm_runtime.mutate import Mutant

CONFIG = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=256)
KEY = ("crash", "lifecycle", "", "SIGSEGV", False, "new")


def _new(req_id: str, prompt: int, block: int) -> NewRequest:
    return NewRequest(req_id, prompt, block_ids=[block])


def decode_of_p_example() -> list[Step]:
    """a, b, c run beside p, whose 8-token prompt is prefilled in two chunks (steps 2, 3) before
    its first decode (step 4); step 5 decodes again. b finishes at step 3."""
    return [
        Step(new_requests=[_new("a", 10, 0), _new("b", 6, 1)], num_scheduled_tokens={"a": 10, "b": 6}),
        Step(new_requests=[_new("c", 12, 2)], cached=[CachedUpdate("a", 10), CachedUpdate("b", 6)],
             num_scheduled_tokens={"a": 1, "b": 1, "c": 12}),
        Step(new_requests=[_new("p", 8, 3)],
             cached=[CachedUpdate("a", 11), CachedUpdate("b", 7), CachedUpdate("c", 12)],
             num_scheduled_tokens={"p": 4, "a": 1, "b": 1, "c": 1}),
        Step(cached=[CachedUpdate("p", 4), CachedUpdate("a", 12), CachedUpdate("c", 13)],
             num_scheduled_tokens={"p": 4, "a": 1, "c": 1}, finished=["b"]),
        Step(cached=[CachedUpdate("p", 8), CachedUpdate("a", 13), CachedUpdate("c", 14)],
             num_scheduled_tokens={"p": 1, "a": 1, "c": 1}),
        Step(cached=[CachedUpdate("p", 9), CachedUpdate("a", 14), CachedUpdate("c", 15)],
             num_scheduled_tokens={"p": 1, "a": 1, "c": 1}),
    ]


def fourth_request_example() -> list[Step]:
    """a, b, c added at step 0 and decoded at steps 1-3; d added at step 4 (its fourth slot)."""
    steps = [Step(new_requests=[_new("a", 8, 0), _new("b", 8, 1), _new("c", 8, 2)],
                  num_scheduled_tokens={"a": 8, "b": 8, "c": 8})]
    for k in range(4):
        cached = [CachedUpdate(r, 8 + k) for r in "abc"]
        steps.append(Step(new_requests=[_new("d", 4, 3)] if k == 3 else [], cached=cached,
                          num_scheduled_tokens={"a": 1, "b": 1, "c": 1, **({"d": 4} if k == 3 else {})}))
    return steps


def dies_at_first_decode_of_p(steps: list[Step]) -> Iterator[bool]:
    computed, prefill = {}, {}
    for step in steps:
        prefill.update({r.req_id: r.num_prefill_tokens for r in step.new_requests})
        computed.update({r.req_id: r.num_computed_tokens for r in step.new_requests})
        computed.update({c.req_id: c.num_computed_tokens for c in step.cached})
        yield "p" in step.num_scheduled_tokens and computed["p"] >= prefill["p"]


def dies_holding_four(steps: list[Step]) -> Iterator[bool]:
    held: set[str] = set()
    for step in steps:
        held -= {*step.finished, *step.preempted}
        held |= {r.req_id for r in step.new_requests}
        yield len(held) >= 4


def stand_in_replay(fault, log: Path, path, extra_checks=(), stages=()):
    """The forked child's replay: the trace read as the replay reads it, each step marked on the
    lifeline, and a real SIGSEGV in lifecycle at the step ``fault`` names."""
    faulthandler.disable()  # pytest's handler would print a traceback per candidate
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    header, steps = read_trace(path)
    with open(log, "a") as fh:  # what each replayed candidate was: its length, whether it was valid
        fh.write(f"{len(steps)} {contract_violations(steps, header.config) == []}\n")
    for i, dies in enumerate(fault(steps)):
        lifeline.mark_step(i)
        lifeline.mark_stage("lifecycle")
        if dies:
            os.kill(os.getpid(), signal.SIGSEGV)
    return [], len(steps)


def contract_violations(steps: list[Step], config: RunnerConfig) -> list:
    contract = SchedulerContract(config)
    return [(i, v.rule) for i, step in enumerate(steps) for v in contract.violations(step)]


def crash_class(steps: list[Step]) -> FindingClass:
    finding = Finding(kind="crash", step=len(steps) - 1, stage="lifecycle", check="supervisor",
                      exception_type="SIGSEGV", message="the campaign's worker died (SIGSEGV)")
    return FindingClass(KEY, finding, count=1, steps=steps, config=CONFIG)


@pytest.fixture
def seeded(monkeypatch, tmp_path):
    """Install a stand-in fault; returns the log of the candidates replayed."""
    log = tmp_path / "replayed.txt"

    def install(fault):
        monkeypatch.setattr(shrink, "replay_with_checks", partial(stand_in_replay, fault, log))
        return log
    return install


def _options(tmp_path) -> CampaignOptions:
    return CampaignOptions(out_dir=tmp_path / "out", progress="quiet", database=None, max_examples=1)


def test_both_examples_are_valid_schedules():
    assert contract_violations(decode_of_p_example(), CONFIG) == []
    assert contract_violations(fourth_request_example(), CONFIG) == []


def test_a_step_dropped_leaves_later_counts_continuous_and_its_new_request_arrives_next():
    steps, _ = without_step((fourth_request_example(), {}), 0)
    assert len(steps) == 4 and contract_violations(steps, CONFIG) == []
    # a, b, c arrive at the next step, as new, with the tokens step 0 computed taken off (8 - 8)
    assert [(r.req_id, r.num_computed_tokens, r.block_ids) for r in steps[0].new_requests] == \
        [("a", 0, [0]), ("b", 0, [1]), ("c", 0, [2])]
    assert [c.num_computed_tokens for c in steps[1].cached] == [1, 1, 1]
    assert without_step((fourth_request_example(), {}), 4) is None  # never the last step


def test_a_request_dropped_leaves_no_trace_of_it_and_no_empty_step():
    steps, _ = without_request(without_request((decode_of_p_example(), {}), "a"), "b")
    assert request_ids(steps) == ["c", "p"] and len(steps) == 5  # step 0 held only a and b
    assert contract_violations(steps, CONFIG) == []


def test_drafts_are_valid_on_decodes_and_a_prefills_last_token_only(tmp_path):
    spec = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=256,
                        num_speculative_tokens=2)
    shrinker = CrashShrinker(FindingClass(KEY, crash_class([]).first, config=spec), _options(tmp_path))
    prefill = Step(new_requests=[_new("a", 8, 0)], num_scheduled_tokens={"a": 8})
    decode = Step(cached=[CachedUpdate("a", 8)], num_scheduled_tokens={"a": 3}, spec_tokens={"a": 2})
    assert shrinker.valid(([prefill, decode], {})) is not None
    # the same decode with the prefill's tokens taken off (a dropped step): drafts mid-prefill
    early = Step(new_requests=[NewRequest("a", 8, num_computed_tokens=4, block_ids=[0])],
                 num_scheduled_tokens={"a": 3}, spec_tokens={"a": 2})
    assert shrinker.valid(([early], {})) is None
    # placeholder drafts on a new request's last prefill token (vLLM rejects every one)
    last = Step(new_requests=[NewRequest("a", 8, num_computed_tokens=7, block_ids=[0])],
                num_scheduled_tokens={"a": 3}, spec_tokens={"a": 2}, rejected={"a": 2})
    assert shrinker.valid(([last], {})) is not None


def test_a_crash_at_one_requests_decode_shrinks_to_its_prefill_and_that_decode(seeded, tmp_path):
    log = seeded(dies_at_first_decode_of_p)
    shrinker = CrashShrinker(crash_class(decode_of_p_example()), _options(tmp_path))
    steps, violations = shrinker.run()
    # p's two prefill chunks and its first decode: without either chunk the decode is a prefill
    assert (len(steps), request_ids(steps), violations, shrinker.note) == (3, ["p"], {}, None)
    assert [s.num_scheduled_tokens for s in steps] == [{"p": 4}, {"p": 4}, {"p": 1}]
    path = tmp_path / "shrunk.jsonl"
    write_trace(path, shrink.shrunk_header(crash_class(steps), _options(tmp_path)), steps)
    _, read = read_trace(path)
    assert read == steps and contract_violations(read, CONFIG) == []
    died = shrink.replays_to_a_crash(path, (), KEY)
    assert died is not None and (died.step, died.stage) == (2, "lifecycle")
    replayed = log.read_text().split("\n")[:-1]
    assert len(replayed) == shrinker.replays + 1 and all(line.endswith("True") for line in replayed)


def test_requests_that_must_be_held_together_are_added_in_one_step(seeded, tmp_path):
    seeded(dies_holding_four)
    shrinker = CrashShrinker(crash_class(fourth_request_example()), _options(tmp_path))
    steps, _ = shrinker.run()
    # the fault needs four requests held at once; one step can add them all
    assert len(steps) == 1 and sorted(r.req_id for r in steps[0].new_requests) == ["a", "b", "c", "d"]
    assert contract_violations(steps, CONFIG) == []


def test_the_replays_are_bounded_and_each_candidate_replayed_was_valid(seeded, tmp_path):
    log = seeded(dies_holding_four)
    shrinker = CrashShrinker(crash_class(fourth_request_example()), _options(tmp_path), max_replays=3)
    steps, _ = shrinker.run()
    replayed = log.read_text().split("\n")[:-1]
    assert shrinker.replays == 3 and len(replayed) == 3 and all(line.endswith("True") for line in replayed)
    assert len(steps) == 5  # the example and one request at a time: no smaller crash in 3 replays


def test_an_example_that_does_not_crash_again_is_kept_whole(seeded, tmp_path):
    seeded(lambda steps: (False for _ in steps))
    shrinker = CrashShrinker(crash_class(decode_of_p_example()), _options(tmp_path))
    steps, _ = shrinker.run()
    assert steps == decode_of_p_example() and shrinker.replays == 1
    assert "did not die as the worker did" in shrinker.note


def test_a_crash_in_another_stage_is_not_the_class(monkeypatch, tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, shrink.shrunk_header(crash_class(decode_of_p_example()), _options(tmp_path)),
                decode_of_p_example())

    def dies_in_prepare(path, extra_checks=(), stages=()):
        faulthandler.disable()
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        lifeline.mark_stage("prepare")
        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(shrink, "replay_with_checks", dies_in_prepare)
    assert shrink.replays_to_a_crash(path, ()) is not None  # a crash ...
    assert shrink.replays_to_a_crash(path, (), KEY) is None  # ... but not in lifecycle


def test_a_supervised_campaign_shrinks_its_crash_class_and_reports_both_lengths(seeded, tmp_path, capsys):
    from simrig.campaign.campaign_report import findings_frame
    from simrig.supervision import forked
    from simrig.supervision.campaign_worker import SupervisedCampaign

    seeded(dies_holding_four)
    forked.dump(tmp_path / "crashes.pkl", [{
        "signal": "SIGSEGV", "stage": "lifecycle", "step": 4, "example": 0, "steps": fourth_request_example(),
        "config": CONFIG, "violations": {}, "chunks": 1, "elapsed_s": 1.0}])
    campaign = SupervisedCampaign(_options(tmp_path), tmp_path)
    shrink_crash_classes(campaign)
    assert "simrig fuzz: crash · lifecycle · SIGSEGV: shrunk 5 -> 1 steps, 4 -> 4 requests" \
        in capsys.readouterr().err
    row = findings_frame(campaign).set_index("kind").loc["crash"]
    assert (row.shrunk_steps, row.example_steps) == (1, 5)
    shrink_crash_classes(campaign)  # shrunk once: a second call replays nothing
    assert capsys.readouterr().err == ""


def test_fuzz_help_states_the_replay_bound():
    from simrig.cli.fuzz_cmd import DESCRIPTION

    assert f"at most {MAX_REPLAYS} replays" in " ".join(DESCRIPTION.split())


# vLLM's add_requests dies of SIGSEGV when the request it adds is the fourth the runner holds:
# what dies_holding_four stands in for, seeded into vLLM's own code
FOURTH_HELD = Mutant(
    "add-requests-segfault-at-four-held", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner.add_requests",
    "req_index = self.req_states.req_id_to_index[req_id]\n",
    "req_index = self.req_states.req_id_to_index[req_id]\n"
    "        if len(self.req_states.req_id_to_index) >= 4:  # a wild pointer, four requests held\n"
    "            __import__('ctypes').string_at(1)\n",
    "add_requests dies of SIGSEGV adding the fourth request the runner holds")


@pytest.mark.vllm
@pytest.mark.slow
def test_a_real_segfault_in_add_requests_shrinks_to_one_step_adding_four_requests(vllm_api, monkeypatch,
                                                                                   tmp_path):
    from simrig.vllm_runtime import mutate

    real = shrink.replay_with_checks

    def seeded_in_the_child(path, extra_checks=(), stages=()):
        faulthandler.disable()
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        mutate.apply(FOURTH_HELD)  # this child's vLLM only
        return real(path, extra_checks, stages)

    monkeypatch.setattr(shrink, "replay_with_checks", seeded_in_the_child)
    shrinker = CrashShrinker(crash_class(fourth_request_example()), _options(tmp_path))
    steps, _ = shrinker.run()
    # the fault needs four requests held at once; one step can add them all
    assert shrinker.note is None and len(steps) == 1
    assert sorted(r.req_id for r in steps[0].new_requests) == ["a", "b", "c", "d"]
    path = tmp_path / "shrunk.jsonl"
    write_trace(path, shrink.shrunk_header(crash_class(steps), _options(tmp_path)), steps)
    assert contract_violations(read_trace(path)[1], CONFIG) == []
    assert shrink.replays_to_a_crash(path, shrink.OPTIONAL_STAGES, KEY) is not None
