"""The axes table: which request features a campaign drew, recognised from the steps."""

from __future__ import annotations

from simrig.campaign.axes import AXES, AxisState, AxisTally
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step

LORA = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128, max_loras=2,
                    num_speculative_tokens=2)


def _drawn(steps: list[Step], config: RunnerConfig = LORA) -> list[list[str]]:
    tally, state, out = AxisTally(), AxisState(), []
    for i, step in enumerate(steps):
        before = dict(tally.steps)
        tally.observe(config, step, state, elapsed_s=float(i), example=0)
        out.append(sorted(name for name, n in tally.steps.items() if n > before.get(name, 0)))
    return out


def test_lora_slot_reuse_needs_another_adapter_gone_first():
    steps = [Step(new_requests=[NewRequest("a", 4, lora_id=1)], num_scheduled_tokens={"a": 4}),
             Step(finished=["a"], new_requests=[NewRequest("b", 4, lora_id=1)], num_scheduled_tokens={"b": 4}),
             Step(finished=["b"], new_requests=[NewRequest("c", 4, lora_id=None)], num_scheduled_tokens={"c": 4})]
    drawn = _drawn(steps)
    assert "LoRA slot reuse" not in drawn[0] and "LoRA slot reuse" not in drawn[1]  # same adapter
    assert "LoRA slot reuse" in drawn[2]  # the base model after adapter 1 left


def test_streaming_update_resumption_and_mixed_drafts():
    steps = [Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4}),
             Step(new_requests=[NewRequest("a", 6, num_computed_tokens=4, streaming=True)],
                  num_scheduled_tokens={"a": 2}),
             Step(preempted=["a"]),
             Step(new_requests=[NewRequest("a", 6, num_computed_tokens=0)], num_scheduled_tokens={"a": 6}),
             Step(new_requests=[NewRequest("b", 3)], cached=[CachedUpdate("a", 6)],
                  num_scheduled_tokens={"a": 2, "b": 3}, spec_tokens={"a": 1})]
    drawn = _drawn(steps)
    assert "streaming update" in drawn[1] and "streaming update" not in drawn[3]
    assert "preemption" in drawn[2] and "resumption" in drawn[3]
    assert {"drafts", "drafts + final prefill chunk", "fewer drafts than K"} <= set(drawn[4])
    assert "placeholder drafts" not in drawn[4]


def test_placeholder_drafts_ride_on_the_last_prompt_token():
    steps = [Step(new_requests=[NewRequest("p", 5, num_computed_tokens=4)], num_scheduled_tokens={"p": 3},
                  spec_tokens={"p": 2}, rejected={"p": 2})]
    assert "placeholder drafts" in _drawn(steps)[0]


def test_the_table_has_a_row_per_axis_with_first_time():
    tally = AxisTally()
    tally.observe(RunnerConfig(pcp_size=2), Step(num_scheduled_tokens={}), AxisState(), elapsed_s=2.5, example=3)
    frame = tally.frame()
    assert list(frame["axis"]) == [a.name for a in AXES]
    row = frame.set_index("axis").loc["PCP > 1"]
    assert (row["first drawn (s)"], row["steps"], row["examples"]) == ("2.5", 1, 1)
    assert frame.set_index("axis").loc["DCP > 1", "first drawn (s)"] == "never"
    assert tally.summary()["DCP > 1"] == {"first_s": None, "steps": 0, "examples": 0}


def test_shards_merge_earliest_first_and_summed_counts():
    a, b = AxisTally(), AxisTally()
    a.observe(RunnerConfig(pcp_size=2), Step(), AxisState(), elapsed_s=5.0, example=0)
    a.observe(RunnerConfig(pcp_size=2), Step(), AxisState(), elapsed_s=6.0, example=0)
    b.observe(RunnerConfig(pcp_size=2), Step(), AxisState(), elapsed_s=3.0, example=0)
    b.observe(RunnerConfig(pcp_size=2), Step(), AxisState(), elapsed_s=4.0, example=1)
    a.merge(b)
    assert a.summary()["PCP > 1"] == {"first_s": 3.0, "steps": 4, "examples": 3}
