"""Rules with one home: the continuity rule, the PCP replication rule, and the
one replay loop that replay, shrinking and the self-test share."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.partition.pcp import is_replicated
from simrig.replay import BatchTracker
from simrig.step import NewRequest, RunnerConfig, Step

REGRESSIONS = Path(__file__).resolve().parents[1] / "traces" / "regressions"


def test_accepted_tokens_are_scheduled_minus_rejected_drafts():
    step = Step(num_scheduled_tokens={"a": 4, "b": 1}, spec_tokens={"a": 3}, rejected={"a": 2})
    assert step.num_accepted("a") == 2
    assert step.num_accepted("b") == 1
    assert step.num_accepted("unscheduled") == 0


def test_rejections_never_exceed_the_drafts_scheduled():
    over = Step(num_scheduled_tokens={"a": 3, "b": 5}, spec_tokens={"a": 2}, rejected={"a": 7, "b": 4})
    assert over.num_accepted("a") == 1  # at most the 2 drafts are rejected
    assert over.num_accepted("b") == 5  # no drafts: nothing can be rejected


def test_batch_tracker_follows_the_capped_rule():
    """An over-reported rejection must not push a finished prefill back to prefill."""
    tracker = BatchTracker()
    first = Step(new_requests=[NewRequest(req_id="a", prompt_len=4, num_computed_tokens=0)],
                 num_scheduled_tokens={"a": 4}, rejected={"a": 3})
    assert tracker.observe(first) == (0, 1, 0)
    second = Step(num_scheduled_tokens={"a": 1})
    assert tracker.observe(second) == (1, 0, 0)  # a decode: 4 tokens were computed


@pytest.mark.parametrize("pcp, dcp, q, prefilling, expected", [
    (2, 1, 1, False, True),   # decodes are always held whole
    (2, 1, 3, True, False),   # prefills split into 2P chunks without DCP
    (2, 2, 3, True, True),    # DCP > 1: 3 tokens cannot fill 4 chunks -> whole
    (2, 2, 4, True, False),   # 4 chunks of 1 token: split
    (4, 2, 7, True, True),    # 8 chunks of 1: the last is empty
    (4, 2, 8, True, False),
])
def test_pcp_replication_rule(pcp, dcp, q, prefilling, expected):
    config = RunnerConfig(pcp_size=pcp, dcp_size=dcp)
    assert is_replicated(config, q, prefilling) is expected


@pytest.mark.vllm
@pytest.mark.parametrize("name", sorted(p.name for p in REGRESSIONS.glob("*.jsonl")))
def test_replay_and_shrink_replay_see_the_same_findings(vllm_api, name):
    """``simrig replay`` and the shrinker's confirmation replay are one loop."""
    from simrig.campaign.shrink import class_key, replay_with_checks
    from simrig.replay import ReplayRecorder, replay_traces

    path = REGRESSIONS / name
    found, count = replay_with_checks(path)
    recorder = ReplayRecorder()
    result = replay_traces([path], recorder=recorder)
    assert count == result.num_steps
    listed = result.findings
    assert len(listed) == len(found)
    assert sorted(zip(listed["kind"], listed["stage"], listed["step"])) == \
        sorted((f.kind, f.stage, f.step) for f in found)
    # past the known findings, a regression trace shows the loud rejection it was shrunk for
    assert {class_key(f)[4] for f in found if not f.known} == {True}
