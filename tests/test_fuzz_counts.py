"""A campaign counts the examples Hypothesis generated and its shrink runs apart.

``--max-examples 30`` once reported 936 examples: every run Hypothesis made while
shrinking a failure counted as an example. These run the real campaign loop, Hypothesis
and the scheduler machine without vLLM: the runner and the checks are stood in, and a
seeded check fails any step that schedules two requests or more, which Hypothesis
then shrinks. The end-to-end count on the real vLLM is in tests/test_fuzz_cli.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from simrig.campaign import campaign_report, fuzz, shrink
from simrig.campaign.fuzz import Campaign, CampaignOptions
from simrig.findings import findings as fk
from simrig.history.store import load_history
from simrig.observe import StepObs


def two_requests(index, step):
    if len(step.num_scheduled_tokens) >= 2:
        return [fk.Finding(kind=fk.VALUE_MISMATCH, step=index, stage="gather", check="seeded",
                           field="two_requests", req_ids=tuple(step.num_scheduled_tokens))]
    return []


class _Pool:
    """The runner pool, without runners."""

    def acquire(self, config, stages):
        return SimpleNamespace(raised_at=None, num_steps=0)

    def release(self, harness):
        pass

    def stats(self):
        return {"built": 0, "reused": 0, "dropped": 0, "tainted": 0}


@pytest.fixture
def no_vllm(monkeypatch, tmp_path):
    from simrig.adapters import runner

    monkeypatch.setattr(runner, "load", lambda: SimpleNamespace(
        version="0.0-test", device="cpu", platform=SimpleNamespace(mode="test")))
    monkeypatch.setattr(fuzz, "shared_pool", lambda: _Pool())
    monkeypatch.setattr("simrig.harness.run_step_guarded", lambda harness, step, trace="": (StepObs(0), []))
    monkeypatch.setattr("strategies.machine.check_step",
                        lambda checker, extra, index, step, obs, violation, trace: two_requests(index, step))
    monkeypatch.setattr(shrink, "replay_with_checks", lambda *a, **k: ([], 1))  # the confirming replay
    monkeypatch.setenv("SIMRIG_HISTORY", str(tmp_path / "history"))


def _campaign(tmp_path, **options) -> Campaign:
    return Campaign(CampaignOptions(**{
        "budget_s": None, "max_examples": 30, "seed": 3, "database": None, "pcp_sizes": (1,),
        "out_dir": tmp_path / "out", "replay_regressions": False, "progress": "quiet",
        "steps_per_example": 8, **options}))


def test_max_examples_30_reports_30_examples_and_the_shrink_runs_apart(no_vllm, tmp_path, capsys):
    campaign = _campaign(tmp_path)
    status = campaign.run()
    st = campaign.stats
    assert status == 1 and st.stopped_by == "max_examples"
    assert st.examples == 30 and st.shrink_runs > 0
    shrunk = [c for c in campaign.classes.values() if c.first.field == "two_requests"][0]
    assert len(shrunk.steps) == 1 and len(shrunk.steps[0].num_scheduled_tokens) == 2  # it did shrink
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["examples"], summary["shrink_runs"]) == (30, st.shrink_runs)
    facts = f"30 examples (+{st.shrink_runs:,} shrink runs), "
    assert facts in (tmp_path / "out" / "report.html").read_text()  # the page's line of facts
    campaign_report.finish(campaign, status, tmp_path / "out", summary_md=None, json_out=False)
    banner = capsys.readouterr().out.splitlines()[0]
    assert banner.startswith(f"fuzz valid: {facts}")
    runs, _ = load_history(tmp_path / "history")
    assert (runs["examples"].tolist(), runs["shrink_runs"].tolist()) == ([30.0], [float(st.shrink_runs)])
    # a shrink run's places are named after the example it shrinks
    places = [w for c in campaign.tally.classes.values() for w in c.traces.values()]
    shrinking = [w for w in places if ".shrink-" in w.trace]
    assert shrinking and all(w.trace.startswith(f"example-{w.example}.shrink-") for w in shrinking)


def test_an_example_that_never_fails_is_never_a_shrink_run(no_vllm, tmp_path, monkeypatch):
    monkeypatch.setattr("strategies.machine.check_step", lambda *a: [])
    campaign = _campaign(tmp_path, max_examples=12)
    campaign.finish = lambda: None
    assert campaign.run() == 0
    assert (campaign.stats.examples, campaign.stats.shrink_runs) == (12, 0)


def test_a_store_written_before_the_column_still_reads(tmp_path):
    import pandas as pd

    from simrig.history.store import RUN_COLUMNS, append_run

    store = tmp_path / "history"
    append_run(store, {"command": "fuzz", "suite": "fuzz valid", "examples": 5}, None)
    old = pd.read_parquet(next((store / "runs").glob("*.parquet"))).drop(columns=["shrink_runs"])
    old.to_parquet(next((store / "runs").glob("*.parquet")), index=False)
    runs, _ = load_history(store)
    assert "shrink_runs" in RUN_COLUMNS and runs["shrink_runs"].isna().all()
    assert runs["examples"].tolist() == [5.0]


def test_the_rule_agrees_with_the_phase_hypothesis_ran_each_test_case_in(no_vllm, tmp_path, monkeypatch):
    """The campaign tells a shrink run by when it began (after its Hypothesis run's first
    failing example); Hypothesis' observations name the phase of each test case. They agree:
    generated test cases that ran a step are the examples, the rest are shrink runs."""
    from hypothesis.internal.observability import add_observability_callback, remove_observability_callback

    ran, seen = [], []
    teardown = Campaign._on_teardown

    def on_teardown(self, machine):
        teardown(self, machine)
        ran.append((bool(machine.steps), bool(machine.__dict__.get("_shrink_run"))))

    def observed(observation, *_):
        if observation.type == "test_case" and ran:
            seen.append((observation.how_generated, *ran.pop()))

    monkeypatch.setattr(Campaign, "_on_teardown", on_teardown)
    campaign = _campaign(tmp_path, max_examples=12)
    campaign.finish = lambda: None
    add_observability_callback(observed, all_threads=True)
    try:
        assert campaign.run() == 1
    finally:
        remove_observability_callback(observed)
    stepped = [(how, shrink_run) for how, steps, shrink_run in seen if steps]
    assert {how for how, _ in stepped} == {"during generate phase", "during shrink phase",
                                           "minimal failing test case"}
    assert all(shrink_run == (how != "during generate phase") for how, shrink_run in stepped)
    assert sum(not s for _, s in stepped) == 12 and sum(s for _, s in stepped) == campaign.stats.shrink_runs


def test_a_sharded_campaign_sums_both_counts_lost_shards_included(tmp_path):
    from simrig.campaign.options import CampaignStats
    from simrig.distributed.fuzz_shards import ShardedCampaign
    from simrig.distributed.shard import ShardResult, plan_shards
    from simrig.findings.classes import ClassTally

    options = CampaignOptions(budget_s=None, max_examples=30, database=None, out_dir=tmp_path / "out",
                              pcp_sizes=(1, 2))
    sharded = ShardedCampaign(options, workers=2)
    s0, s1 = plan_shards(options, 2)
    sharded.specs = {s0.name: s0, s1.name: s1}
    stats = CampaignStats(examples=30, shrink_runs=57, steps=400, stopped_by="max_examples")
    sharded.results[s0.name] = ShardResult(s0.name, "w0", stats, None, None, None, [], ClassTally())
    sharded.status[s0.name] = "done"
    lost = SimpleNamespace(stats={"examples": 11, "shrink_runs": 5, "steps": 90}, counts={}, worker="w1")
    sharded._merge({"shards": {s1.name: lost}, "classes": {}, "found_by": {}, "best_from": {},
                    "stopped": False})
    st = sharded.merged.stats
    assert (st.examples, st.shrink_runs, st.steps) == (41, 62, 490)
    assert [(r.shard, r.examples, r.shrink_runs) for r in sharded.rows] == [("s0", 30, 57), ("s1", 11, 5)]
    assert sharded.merged.summary()["shrink_runs"] == 62
