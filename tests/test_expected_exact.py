"""Expected outcomes exactly as declared: a violation excuses only what it names.

- a loud rejection is a KeyError (or the checker's input note) in lifecycle or
  gather naming an id the violation names; the same KeyError elsewhere, or
  naming another request, stays a finding;
- value checks keep running for every request a violation (or an earlier
  desync) does not touch;
- an error in a stage after gather does not hide a silent acceptance.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simrig.checks.checker import Checker, check_step, is_rejection_of, silent_acceptance_finding
from simrig.checks.lifecycle import DUPLICATE_NEW, UNKNOWN_ID
from simrig.findings import findings as fk
from simrig.harness import Harness
from simrig.observe import ErrorObs
from simrig.step import CachedUpdate, NewRequest, Step
from tests.test_checks_real import CONFIGS, clean_steps, set_field

pytestmark = pytest.mark.vllm


def test_rejection_rule_names_stage_and_ids():
    key = lambda stage, ids: fk.Finding(kind=fk.KEY_ERROR, step=1, stage=stage, check="runner",
                                        req_ids=ids, exception_type="KeyError")
    assert is_rejection_of(key("gather", ("ghost",)), {"ghost"})
    assert is_rejection_of(key("lifecycle", ("ghost", "a")), {"ghost"})
    assert not is_rejection_of(key("prepare", ("ghost",)), {"ghost"})  # too late to be a refusal
    assert not is_rejection_of(key("gather", ("a",)), {"ghost"})  # another request's KeyError
    assert not is_rejection_of(key("gather", ()), {"ghost"})
    value = fk.Finding(kind=fk.VALUE_MISMATCH, step=1, stage="gather", check="reference", req_ids=("ghost",))
    assert not is_rejection_of(value, {"ghost"})


def _check(vllm_api, steps, *, violations=None, extra=(), corrupt=None):
    """check_step on each step through a real harness; ``corrupt(i, obs)`` edits an observation."""
    config = CONFIGS["plain"]
    harness = Harness(config, api=vllm_api)
    checker = Checker(config, adversarial=bool(violations), trace="t")
    found = []
    for i, s in enumerate(steps):
        obs = harness.run_step(s)
        if corrupt is not None:
            corrupt(i, obs)
        found += check_step(checker, extra, i, s, obs, (violations or {}).get(i), "t")
    return found


def test_only_the_named_keyerror_is_a_loud_rejection(vllm_api):
    bad = Step(cached=[CachedUpdate("a", 40), CachedUpdate("b", 20), CachedUpdate("c", 4)],
               num_scheduled_tokens={"a": 1, "b": 1, "c": 1, "ghost": 1})

    def stray(index, step, obs):  # findings a buggy runner could add on the same step
        if index != 1:
            return []
        return [fk.Finding(kind=fk.KEY_ERROR, step=1, stage="prepare", check="extra", req_ids=("ghost",),
                           exception_type="KeyError"),
                fk.Finding(kind=fk.KEY_ERROR, step=1, stage="gather", check="extra", req_ids=("a",),
                           exception_type="KeyError")]

    found = [f for f in _check(vllm_api, [clean_steps()[0], bad], violations={1: UNKNOWN_ID},
                               extra=[stray]) if f.step == 1]
    loud = {(f.kind, f.stage, f.req_ids) for f in found if f.extra.get("loud_rejection")}
    assert (fk.KEY_ERROR, "gather", ("ghost",)) in loud
    assert (fk.CONTRACT_VIOLATION_INPUT, "lifecycle", ("ghost",)) in loud
    not_loud = {(f.stage, f.req_ids) for f in found if f.check == "extra" and not f.extra.get("loud_rejection")}
    assert not_loud == {("prepare", ("ghost",)), ("gather", ("a",))}


def test_value_checks_continue_for_requests_a_desync_does_not_touch(vllm_api):
    steps = clean_steps()[:2]
    steps[1] = dataclasses.replace(steps[1], cached=[CachedUpdate("a", 40), CachedUpdate("b", 19),
                                                     CachedUpdate("c", 4)])  # b: 20 were computed

    def corrupt_a(index, obs):
        if index == 1:
            order = list(obs.get("prepare").fields["req_ids"].values)
            values = np.asarray(obs.get("prepare").fields["positions"].values).copy()
            values[order.index("a")] += 7
            set_field(obs, "prepare", "positions", values=values)

    clean = [f for f in _check(vllm_api, steps) if f.step == 1 and not f.known]
    assert {(f.kind, f.field, f.req_ids) for f in clean} == {
        (fk.CONTRACT_VIOLATION_INPUT, "num_computed_tokens", ("b",))}  # b's own values are set aside
    found = [f for f in _check(vllm_api, steps, corrupt=corrupt_a) if f.step == 1 and not f.known]
    assert ("reference", "positions", ("a",)) in {(f.check, f.field, f.req_ids) for f in found}


def test_an_error_after_gather_does_not_hide_a_silent_acceptance(vllm_api):
    config = CONFIGS["plain"]
    harness = Harness(config, api=vllm_api)
    harness.run_step(clean_steps()[0])
    dup = Step(new_requests=[NewRequest("a", 3)], num_scheduled_tokens={"a": 3})
    obs = harness.run_step(dup)
    assert not obs.errors  # vLLM accepts the duplicate id silently (a known finding)
    obs.get("dummy").error = ErrorObs("RuntimeError", "a later stage failed", ())
    found = silent_acceptance_finding(1, dup, obs, DUPLICATE_NEW, [], "t")
    assert [(f.kind, f.stage) for f in found] == [(fk.SILENT_ACCEPTANCE, "lifecycle")]
    obs.get("lifecycle").error = ErrorObs("KeyError", "'a'", ("a",))
    assert silent_acceptance_finding(1, dup, obs, DUPLICATE_NEW, [], "t") == []
