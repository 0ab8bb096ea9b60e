"""The stateful machine against the real runner (vLLM 0.33.0 installed)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from simrig.findings import findings as fk
from simrig.step import RunnerConfig
from strategies import MachineSettings, NewFinding, SchedulerContractMachine

pytestmark = pytest.mark.vllm

SMALL = st.just(RunnerConfig(max_num_reqs=3, max_num_batched_tokens=32, max_model_len=48,
                             num_speculative_tokens=2))
RUN = settings(max_examples=4, stateful_step_count=8, deadline=None, database=None,
               derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def api():
    from simrig.adapters.runner import load

    return load()


def _collect(mode, violations=(), extra_checks=(), stages=("gather", "prepare", "dummy")):
    seen = {"steps": [], "findings": []}

    def on_step(machine, index, step, obs, found):
        seen["steps"].append((machine.violations.get(index), step))
        seen["findings"].extend(found)
        return [f for f in found if not f.known and not f.extra.get("loud_rejection")]

    ms = MachineSettings(mode=mode, configs=SMALL, violations=violations, on_step=on_step,
                         extra_checks=extra_checks, stages=stages)
    return SchedulerContractMachine.bind(ms), seen


def test_valid_mode_runs_real_steps_without_unknown_findings(api):
    machine, seen = _collect("valid")
    run_state_machine_as_test(machine, settings=RUN)
    assert seen["steps"], "no step reached the real runner"
    assert all(v is None for v, _ in seen["steps"])
    assert not [f for f in seen["findings"] if not f.known]


def test_adversarial_unknown_ids_are_rejected_loudly(api):
    machine, seen = _collect("adversarial", violations=("unknown_id", "unknown_cached"))
    run_state_machine_as_test(machine, settings=RUN)
    violating = [i for i, (v, _) in enumerate(seen["steps"]) if v]
    assert violating, "the adversarial machine sent no violation"
    loud = [f for f in seen["findings"] if f.extra.get("loud_rejection")]
    assert {f.kind for f in loud} >= {fk.KEY_ERROR}
    assert all(f.exception_type == "KeyError" for f in loud if f.kind == fk.KEY_ERROR)
    assert not [f for f in seen["findings"] if f.kind == fk.SILENT_ACCEPTANCE]


def test_duplicate_new_id_is_silently_accepted_by_this_vllm(api):
    """vLLM 0.33.0 treats a new request for a held id as a streaming-input
    update (remove, re-add): the machine reports it as silent_acceptance."""
    machine, seen = _collect("adversarial", violations=("duplicate_new",), stages=("gather",))
    run_state_machine_as_test(machine, settings=settings(RUN, max_examples=40, stateful_step_count=16))
    if not any(v for v, _ in seen["steps"]):
        pytest.fail("no duplicate_new violation was generated")
    assert any(f.kind == fk.SILENT_ACCEPTANCE for f in seen["findings"])


def test_a_failing_extra_check_raises_new_finding_with_the_steps(api):
    def every_step(index, step, obs):
        return [fk.Finding(kind=fk.VALUE_MISMATCH, step=index, stage="prepare", check="test",
                           field="always")]

    machine, _ = _collect("valid", extra_checks=(every_step,), stages=("gather",))
    no_shrink = settings(RUN, phases=[Phase.generate])  # shrinking is tested in test_shrinking
    with pytest.raises(NewFinding) as info:
        run_state_machine_as_test(machine, settings=no_shrink)
    assert len(info.value.steps) == 1  # it fails on the first step the runner sees
    assert info.value.findings[0].field == "always" and info.value.config.max_num_reqs == 3


def test_plugin_fixtures_drive_generated_steps(simrig_harness, simrig_checker):
    """The pytest11 fixtures + re-exported strategies, as a vLLM test suite would use them."""
    from simrig.campaign.pytest_plugin import given, scheduled_runs

    seen = []

    @settings(RUN, max_examples=2)
    @given(scheduled_runs(config=SMALL, max_steps=3))
    def body(run):
        config, steps = run
        harness, checker = simrig_harness(config, stages=("gather",)), simrig_checker(config)
        for i, step in enumerate(steps):
            obs = harness.run_step(step)
            assert obs.get("gather").error is None
            assert not [f for f in checker.check(i, step, obs) if not f.known]
            seen.append(i)

    body()
    assert seen
