"""``simrig fuzz`` end to end: usage errors, the adversarial KeyError class, regressions, SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from test_report_agreement import assert_report_agrees

from simrig.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0"], "--budget"),
    (["--pcp-sizes", "3"], "--pcp-sizes"),
    (["--pcp-sizes", "x"], "--pcp-sizes"),
    (["--violations", "nope"], "--violations"),
    (["--max-examples", "0"], "--max-examples"),
    (["--stages", "partition"], "--stages"),
    (["--profile", "--workers", "2"], "--profile"),
])
def test_usage_errors_are_one_line_exit_2(argv, message, capsys, tmp_path):
    assert main(["fuzz", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "o").exists()


def test_out_that_is_a_file_is_refused(capsys, tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["fuzz", "--out", str(target)]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.vllm
def test_adversarial_campaign_finds_the_unknown_id_key_error_class(tmp_path, capsys):
    out = tmp_path / "adv"
    # --max-examples without --budget: no clock anywhere, so the shrink always runs to the end
    status = main(["fuzz", "--no-coverage", "--mode", "adversarial", "--max-examples", "30", "--seed", "5",
                   "--pcp-sizes", "1", "--stages", "gather", "--out", str(out),
                   "--database", "none", "--no-regressions", "--progress", "quiet"])
    table = pd.read_csv(out / "findings.csv", keep_default_na=False)
    hit = table[(table.kind == "key_error") & (table.exception_type == "KeyError") & table.loud_rejection
                & (table.field == "unknown_scheduled_id")]
    assert len(hit), table[["kind", "stage", "field", "loud_rejection"]]
    row = hit.iloc[0]
    assert 1 <= row.shrunk_steps <= 3 and str(row.reproduced) == "True"
    assert os.path.exists(row.shrunk_trace)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["loud_rejections"] > 0 and summary["violations_sent"] >= summary["loud_rejections"]
    # the examples asked for, Hypothesis' runs shrinking the classes counted apart (issue: 936 "examples")
    assert summary["examples"] == 30 and summary["shrink_runs"] > 0
    # Loud rejections never fail the campaign; only failing classes do.
    assert status == (1 if table.failing.astype(str).eq("True").any() else 0)
    junit = (out / "junit.xml").read_text()
    assert "key_error:gather" in junit and junit.count("<testcase") == len(table)
    assert_report_agrees(out, status)
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    loud = classes[(classes.kind == "key_error") & (classes.stage == "gather")]
    assert set(loud.verdict) == {"expected"}  # a loud rejection is expected, never "new"
    assert loud.reproduce.iloc[0].startswith("simrig replay ") and loud.first_example.iloc[0] >= 0
    assert (table.verdict == "new").sum() == summary["failing_classes"]


@pytest.mark.vllm
def test_regressions_are_replayed_first(tmp_path, capsys):
    regressions = tmp_path / "reg"
    regressions.mkdir()
    (regressions / "ghost.jsonl").write_text(
        '{"format":"simrig-trace","version":1,"config":{"max_num_reqs":2},"adversarial":true,'
        '"source":{"kind":"shrunk","violation_steps":{"0":"unknown_id"}}}\n'
        '{"step":0,"num_scheduled_tokens":{"ghost":1}}\n')
    out = tmp_path / "o"
    status = main(["fuzz", "--no-coverage", "--budget", "1", "--max-examples", "1", "--pcp-sizes", "1", "--stages", "gather",
          "--regressions", str(regressions), "--out", str(out), "--database", "none",
          "--progress", "quiet"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["regression_traces"] == 1 and summary["regression_steps"] == 1
    assert summary["exit_status"] == status
    table = pd.read_csv(out / "findings.csv", keep_default_na=False)
    assert (table.source == str(regressions / "ghost.jsonl")).any()
    assert_report_agrees(out, summary["exit_status"])


@pytest.mark.vllm
@pytest.mark.slow
def test_sigint_ends_the_campaign_with_a_report(tmp_path):
    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "simrig", "fuzz", "--no-coverage", "--budget", "300", "--pcp-sizes", "1",
         "--stages", "gather", "--out", str(out), "--database", "none", "--no-regressions",
         "--progress", "plain"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    for line in proc.stderr:  # wait until the campaign has started exploring
        if "campaign" in line or time.time() > deadline:
            break
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "signal" and summary["elapsed_s"] < 200
    assert proc.returncode in (0, 1)
