"""Shrinking: an injected fault in a test-only check shrinks to a minimal trace
that replays to the same finding."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from simrig.campaign.fuzz import Campaign, CampaignOptions
from simrig.campaign.shrink import class_key, replay_with_checks
from simrig.findings import findings as fk
from simrig.step import RunnerConfig
from simrig.trace_io.trace import read_trace

pytestmark = pytest.mark.vllm


def three_requests_with_a_spec_decode(index, step, obs):
    """The injected fault: any step with >= 3 requests, one of them a spec decode."""
    if len(step.num_scheduled_tokens) >= 3 and step.spec_tokens:
        return [fk.Finding(kind=fk.VALUE_MISMATCH, step=index, stage="gather", check="injected",
                           field="injected_fault", req_ids=tuple(step.num_scheduled_tokens))]
    return []


@pytest.mark.slow  # ~30 s of campaign and shrinking
def test_injected_fault_shrinks_to_a_minimal_replayable_trace(tmp_path):
    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=64,
                          num_speculative_tokens=2)
    # A number of examples and no budget: no clock anywhere, the same run on any load.
    # Hypothesis' shrinker stops at a local minimum: at most three steps whose last one
    # schedules exactly three requests with one draft; a request finished on the way (to
    # free its slot) may stay, depending on the draws (the scheduler model's rules, the
    # seed). Draws depend on the seed alone (campaign/repeatable.py).
    options = CampaignOptions(
        budget_s=None, max_examples=40, seed=1, out_dir=tmp_path / "out", database=None,
        replay_regressions=False, stages=(), extra_checks=(three_requests_with_a_spec_decode,),
        configs=st.just(config), progress="quiet", steps_per_example=15)
    campaign = Campaign(options)
    assert campaign.run() == 1
    injected = [c for c in campaign.classes.values() if c.first.field == "injected_fault"]
    assert injected, "the campaign never hit the injected fault"
    cls = injected[0]
    assert cls.reproduced is True and cls.failing
    header, steps = read_trace(cls.trace_path)
    assert header.source["kind"] == "shrunk"
    # Minimal: prefill three requests, then one step that schedules exactly
    # three with exactly one draft token (fewer would not trip the fault).
    assert len(steps) <= 3
    last = steps[-1]
    assert len(last.num_scheduled_tokens) == 3 and sum(last.spec_tokens.values()) == 1
    assert not any(s.preempted for s in steps)
    found, _ = replay_with_checks(cls.trace_path, options.extra_checks, options.stages)
    assert class_key(cls.first) in {class_key(f) for f in found}
    assert (tmp_path / "out" / "junit.xml").read_text().count("<failure") >= 1
