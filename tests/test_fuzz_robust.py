"""Nothing lost, nothing confusing: a fuzz campaign's report survives a
concurrent campaign with the same --out and signals while it is written, a rig
error stops it as a rig error (in the class table), and the same seed with
--max-examples gives the same campaign however slow the machine is.

Most of these run without vLLM: the vLLM load is stood in and the campaign's
findings are put in by hand, as the audit did (``Campaign(...).finish()``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from simrig.campaign import campaign_report
from simrig.campaign import shrink
from simrig.campaign.fuzz import Campaign, CampaignOptions, FindingClass
from simrig.findings.classes import Where
from simrig.findings.findings import Finding
from simrig.report.writer import REPORT_FILES
from simrig.step import NewRequest, RunnerConfig, Step

REPO = Path(__file__).resolve().parents[1]


def _found(campaign: Campaign, field: str = "injected_fault") -> FindingClass:
    """A failing class with a one-step run, as if the machine had found and shrunk it."""
    finding = Finding(kind="value_mismatch", step=0, stage="gather", check="injected", field=field,
                      req_ids=("a",), message="injected")
    cls = FindingClass(shrink.class_key(finding), finding, count=3, config=RunnerConfig(),
                       steps=[Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})])
    campaign.classes[cls.key] = cls
    campaign.tally.add(finding, Where("example-0", example=0), count=3)
    return cls


def _fake_vllm(monkeypatch) -> None:
    from simrig.adapters import runner

    api = SimpleNamespace(version="0.0-test", device="cpu", platform=SimpleNamespace(mode="test"))
    monkeypatch.setattr(runner, "load", lambda: api)


def _assert_complete(out: Path) -> dict:
    names = {p.name for p in out.iterdir()}
    assert set(REPORT_FILES) | {"junit.xml", "occurrences.csv"} <= names, names
    return json.loads((out / "summary.json").read_text())


# ---------------------------------------------------------------- task 1: same --out
FINISHER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from test_fuzz_robust import _found
    from simrig.campaign import shrink
    from simrig.campaign.fuzz import Campaign, CampaignOptions

    shrink.replay_with_checks = lambda *a, **k: ([], 1)  # the confirming replay, without vLLM
    failures = 0
    for i in range(int(sys.argv[2])):
        campaign = Campaign(CampaignOptions(out_dir=Path(sys.argv[1]), progress="quiet", database=None))
        _found(campaign)
        try:
            campaign.finish()
        except Exception as exc:
            failures += 1
            print(repr(exc), file=sys.stderr)
    print(failures)
""")


def test_two_processes_finishing_campaigns_into_one_out_never_break_each_other(tmp_path):
    out = tmp_path / "same"
    procs = [subprocess.Popen([sys.executable, "-c", FINISHER, str(out), "20", str(REPO / "tests")],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results):
        assert proc.returncode == 0, stderr[-3000:]
        assert stdout.strip().splitlines()[-1] == "0", stderr[-3000:]  # no finish failed
    summary = _assert_complete(out)
    assert summary["finding_classes"] == 1 and summary["exit_status"] == 1
    assert [p.name for p in (out / "shrunk").iterdir()] == [
        "value_mismatch-gather-injected_fault.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same"]  # no staging folder left behind


# ---------------------------------------------------------------- task 2: Ctrl-C
def test_signals_while_the_report_is_written_are_ignored_until_it_is(tmp_path, monkeypatch):
    """The first SIGINT stops exploring; SIGINT and SIGTERM during the shrink
    confirmation and during the report's writing cost nothing: the report is
    complete, and --save-regressions writes only once it is in place."""
    _fake_vllm(monkeypatch)
    out, regressions = tmp_path / "out", tmp_path / "regressions"
    regressions.mkdir()
    pid = os.getpid()
    seen = {}

    def explore(self):
        _found(self)
        os.kill(pid, signal.SIGINT)  # the first Ctrl-C: stop exploring
        seen["stopped"] = self.stopped()

    def confirm(path, *args, **kwargs):  # the shrunk trace's confirming replay
        os.kill(pid, signal.SIGINT)
        finding = Finding(kind="value_mismatch", step=0, stage="gather", check="injected",
                          field="injected_fault")
        return [finding], 1

    real_junit = campaign_report.junit_xml

    def junit(campaign):  # the last step before the swap into OUT
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)
        seen["regressions before the swap"] = sorted(p.name for p in regressions.iterdir())
        return real_junit(campaign)

    monkeypatch.setattr(Campaign, "explore", explore)
    monkeypatch.setattr(shrink, "replay_with_checks", confirm)
    monkeypatch.setattr(campaign_report, "junit_xml", junit)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    campaign = Campaign(CampaignOptions(out_dir=out, progress="quiet", database=None,
                                        replay_regressions=False, save_regressions=True,
                                        regressions_dir=regressions))
    status = campaign.run()  # no KeyboardInterrupt escapes
    assert status == 1 and seen["stopped"] is True
    summary = _assert_complete(out)
    assert summary["stopped_by"] == "signal" and summary["repeatable"] is False
    assert "stopped by a signal" in summary["not_repeatable_because"]
    assert summary["exit_status"] == 1 and summary["classes"]["new"] == 1
    shrunk = out / "shrunk" / "value_mismatch-gather-injected_fault.jsonl"
    findings = pd.read_csv(out / "findings.csv", keep_default_na=False)
    assert findings.shrunk_trace.tolist() == [str(shrunk)] and shrunk.is_file()
    assert str(findings.reproduced.iloc[0]) == "True"
    assert seen["regressions before the swap"] == []
    assert [p.name for p in regressions.iterdir()] == [shrunk.name]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ---------------------------------------------------------------- task 3/4: rig errors
def _raise_in_config(_):
    raise ZeroDivisionError("a bug in a config strategy")


def test_a_rig_error_stops_the_campaign_as_a_rig_error_in_the_class_table(tmp_path, monkeypatch):
    from hypothesis import strategies as st

    _fake_vllm(monkeypatch)
    out = tmp_path / "out"
    campaign = Campaign(CampaignOptions(
        out_dir=out, progress="quiet", database=None, replay_regressions=False, max_examples=5,
        budget_s=None, configs=st.just(0).map(_raise_in_config)))
    assert campaign.run() == 3
    summary = _assert_complete(out)
    assert summary["stopped_by"] == "rig_error" and summary["exit_status"] == 3
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    rig = classes[classes.kind == "rig_error"]
    assert len(rig) == 1 and rig.verdict.tolist() == ["new"] and rig.exception_type.tolist() == [
        "ZeroDivisionError"]
    assert rig.occurrences.tolist() == [campaign.classes[next(
        k for k in campaign.classes if k[0] == "rig_error")].count]
    assert summary["classes"]["new"] == 1
    assert "a bug in a config strategy" in (out / "junit.xml").read_text()


def test_a_malformed_known_findings_file_is_a_rig_error_stop_not_a_signal(tmp_path, monkeypatch):
    """What the audit saw: the file fails inside the machine's first example."""
    from simrig.findings import known

    _fake_vllm(monkeypatch)
    bad = tmp_path / "known-findings.json"
    bad.write_text('{"findings": [{"kind": ')
    monkeypatch.setenv(known.KNOWN_ENV, str(bad))
    monkeypatch.setattr("simrig.harness.Harness", lambda *a, **k: None)  # no vLLM needed before it
    campaign = Campaign(CampaignOptions(out_dir=tmp_path / "out", progress="quiet", database=None,
                                        replay_regressions=False, max_examples=3, budget_s=None))
    campaign.finish = lambda: None  # the report reads the same file (the CLI checks it first)
    assert campaign.run() == 3
    assert campaign.stats.stopped_by == "rig_error"
    assert any("invalid JSON" in text or "known-findings" in text for text in campaign.stats.rig_errors)


# ---------------------------------------------------------------- task 7: when to stop
def test_max_examples_alone_never_stops_on_the_clock_nor_starts_a_chunk_after_them(monkeypatch):
    campaign = Campaign(CampaignOptions(max_examples=4, budget_s=None, progress="quiet"))
    monkeypatch.setattr(campaign, "_elapsed", lambda: 1e9)  # a very slow machine
    assert not campaign.stopped() and campaign._explore_more()
    campaign.stats.examples = 4
    assert campaign.stopped() and not campaign._explore_more()
    campaign._chunk_failed = True  # a failure found on the last example: shrink it, whatever the time
    assert not campaign.stopped() and not campaign._explore_more()
    assert campaign._stopped_by() == "max_examples"
    campaign.options.database = None
    campaign.stats.stopped_by = campaign._stopped_by()
    assert campaign.not_repeatable() == []


def test_a_budget_given_with_max_examples_still_bounds_the_run_and_says_so(monkeypatch):
    campaign = Campaign(CampaignOptions(max_examples=1000, budget_s=10, progress="quiet",
                                        database=None))
    monkeypatch.setattr(campaign, "_elapsed", lambda: 11.0)
    assert campaign.stopped() and not campaign._explore_more()
    campaign.stats.stopped_by = campaign._stopped_by()
    summary = campaign.summary()
    assert summary["stopped_by"] == "budget" and summary["repeatable"] is False
    assert summary["not_repeatable_because"] == ["stopped by the time budget"]
    summary.update(classes={}, examples_per_s=0.0, steps_per_s=0.0)
    assert "NOT repeatable: stopped by the time budget" in campaign_report.headline(summary)


def test_without_a_budget_a_machine_that_sends_no_step_still_ends(tmp_path, monkeypatch):
    """Only examples that ran a step count; if none ever does, the campaign ends
    after a few Hypothesis runs ("idle") instead of looping for ever."""
    from simrig.campaign import fuzz

    _fake_vllm(monkeypatch)
    monkeypatch.setattr("simrig.harness.Harness", lambda *a, **k: None)
    monkeypatch.setattr(Campaign, "stopped", lambda self: True)  # every rule skips the real code
    campaign = Campaign(CampaignOptions(out_dir=tmp_path / "out", progress="quiet", database=None,
                                        replay_regressions=False, max_examples=5, budget_s=None))
    assert campaign.run() == 0
    assert campaign.stats.stopped_by == "idle" and campaign.stats.chunks == fuzz.IDLE_CHUNKS
    assert campaign.stats.examples == 0 and campaign.stats.steps == 0


def test_a_campaign_needs_a_budget_or_max_examples():
    from simrig.errors import UsageError

    with pytest.raises(UsageError, match="--budget or --max-examples"):
        Campaign(CampaignOptions(budget_s=None, max_examples=None))


@pytest.mark.vllm
def test_the_same_seed_gives_the_same_campaign_on_a_slow_machine(tmp_path, monkeypatch, vllm_api):
    """Two runs of one seeded campaign, the second with every step slowed down:
    the same examples, steps, chunks, classes and occurrence counts."""
    import time

    import simrig.harness

    def campaign(out: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
        c = Campaign(CampaignOptions(
            mode="adversarial", seed=11, max_examples=12, budget_s=None, pcp_sizes=(1,),
            stages=("gather",), steps_per_example=6, chunk_examples=5, database=None,
            replay_regressions=False, progress="quiet", out_dir=out))
        c.run()
        classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
        findings = pd.read_csv(out / "findings.csv", keep_default_na=False)
        return json.loads((out / "summary.json").read_text()), classes, findings

    fast = campaign(tmp_path / "fast")
    real_step = simrig.harness.run_step_guarded

    slowed = []

    def slow_step(*args, **kwargs):
        slowed.append(1)
        time.sleep(0.05)  # a loaded machine: every step much slower
        return real_step(*args, **kwargs)

    monkeypatch.setattr(simrig.harness, "run_step_guarded", slow_step)
    slow = campaign(tmp_path / "slow")
    same = ("examples", "steps", "chunks", "findings", "finding_classes", "findings_by_kind",
            "loud_rejections", "violations_sent", "stopped_by", "repeatable")
    assert {k: fast[0][k] for k in same} == {k: slow[0][k] for k in same}
    assert fast[0]["stopped_by"] == "max_examples" and fast[0]["repeatable"] is True
    assert fast[0]["examples"] >= 12 and fast[0]["findings"] > 0
    assert len(slowed) >= slow[0]["steps"] > 0  # every step of the second run was slowed down
    columns = ["signature", "verdict", "occurrences", "first_example", "first_step", "last_step"]
    pd.testing.assert_frame_equal(fast[1][columns], slow[1][columns])
    columns = ["kind", "stage", "field", "count", "verdict", "shrunk_steps", "reproduced"]
    pd.testing.assert_frame_equal(fast[2][columns], slow[2][columns])


def test_regression_traces_are_checked_before_the_run_and_dot_files_skipped(tmp_path, capsys):
    """A malformed regression trace is bad input (one line, exit 2, no report);
    a TraceWriter's leftover `.tmp-*` file is not a regression trace at all."""
    import argparse

    from simrig.cli import build_parser, main
    from simrig.cli.fuzz_cmd import options_from_args

    regressions = tmp_path / "regressions"
    regressions.mkdir()
    (regressions / ".tmp-abc123ghost.jsonl").write_text('{"format": "simrig-trace", "vers')
    args = build_parser().parse_args(["fuzz", "--regressions", str(regressions),
                                      "--out", str(tmp_path / "o1")])
    assert isinstance(args, argparse.Namespace)
    options = options_from_args(args)  # the leftover is neither read nor refused
    assert options.regressions_dir == regressions and options.budget_s == 60.0
    (regressions / "broken.jsonl").write_text('{"format": "simrig-trace", "version": 1}\n{"step": 0,\n')
    assert main(["fuzz", "--regressions", str(regressions), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.jsonl:2" in err[0], err
    assert not (tmp_path / "o2").exists()


def test_max_examples_alone_means_no_budget_on_the_command_line(tmp_path):
    from simrig.cli import build_parser
    from simrig.cli.fuzz_cmd import options_from_args

    def options(*argv: str) -> CampaignOptions:
        return options_from_args(build_parser().parse_args(["fuzz", "--out", str(tmp_path / "o"),
                                                            *argv]))

    assert options("--max-examples", "5").budget_s is None
    assert options("--max-examples", "5", "--budget", "9").budget_s == 9
    assert options().budget_s == 60.0 and options().max_examples is None
