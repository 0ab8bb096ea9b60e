"""Banner, class table, summary.json and exit status tell one story, in every report kind.

``assert_report_agrees`` walks a written report; the replay cases run here, the
fuzz and selftest ones call it from their own end-to-end tests
(tests/test_fuzz_cli.py, tests/test_selftest.py) so no campaign runs twice.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from simrig.cli import main
from simrig.findings.classes import verdict_line
from tests import mutant_cli

ROOT = Path(__file__).resolve().parents[1]
REGRESSIONS = ROOT / "traces" / "regressions"


def assert_report_agrees(out: Path, status: int) -> dict:
    """Every place a report states its verdict says the same; returns summary.json."""
    summary = json.loads((out / "summary.json").read_text())
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    counts = {"classes": len(classes),
              **{v: int((classes["verdict"] == v).sum()) for v in ("new", "known", "expected")}}
    assert summary["classes"] == counts
    assert summary["exit_status"] == status
    if "verdict_note" not in summary:  # a rig error fails a run without a class (noted)
        assert (counts["new"] > 0) == (status == 1), (counts, status)
    assert pd.read_parquet(out / "classes.parquet").shape == classes.shape
    page = (out / "report.html").read_text()
    banner = re.search(r"<p class='banner (good|bad)'>(.*?)</p>", page)
    assert banner is not None and page.index("class='banner") < page.index("<h2>")  # opens at it
    text = html.unescape(banner.group(2))
    assert verdict_line(counts) in text and f"exit {status}" in text
    assert (banner.group(1) == "bad") == (status != 0)
    assert page.count("<span class='note'>checks:") == len(classes)  # one row per class
    for signature in classes["signature"]:
        assert html.escape(signature) in page
    return summary


@pytest.mark.vllm
def test_shipped_regression_traces_replay_green_with_their_expected_classes(tmp_path, capsys):
    out = tmp_path / "rep"
    status = main(["replay", str(REGRESSIONS), "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    summary = assert_report_agrees(out, 0)
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    expected = classes[classes["verdict"] == "expected"]
    # each trace's declared KeyError (plus the checker's contract-violation notes)
    assert {("key_error", "gather", "unknown_scheduled_id"),
            ("key_error", "lifecycle", "unknown_cached_id"),
            ("key_error", "gather", "scheduled_after_finish")} <= set(
        zip(expected["kind"], expected["stage"], expected["field"]))
    known = classes[classes["verdict"] == "known"]
    assert len(known) and known["explanation"].str.len().gt(0).all()
    assert summary["new"] == 0 and summary["time_share"]["vllm_s"] > 0
    assert "no new finding classes" in printed and "[NEW]" not in printed


@pytest.mark.vllm
def test_a_new_class_fails_everywhere_at_once(tmp_path, capsys, ghost_trace):
    trace = ghost_trace
    out = tmp_path / "rep"
    status = main(["replay", str(trace), "--stages", "gather,dummy", "--out", str(out), "--quiet"])
    assert status == 1
    summary = assert_report_agrees(out, 1)
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    new = classes[classes["verdict"] == "new"]
    assert f"simrig replay {trace} --stages gather,dummy" in set(new["reproduce"])
    findings = pd.read_csv(out / "findings.csv", keep_default_na=False)
    assert int((findings["verdict"] == "new").sum()) == summary["new"] > 0
    assert "ghost-7" in new["req_ids"].str.cat(sep=",")


@pytest.mark.vllm
def test_json_prints_only_the_summary(tmp_path, capsys):
    out = tmp_path / "rep"
    status = main(["replay", str(REGRESSIONS / "key_error-gather-unknown_scheduled_id-KeyError-loud.jsonl"),
                   "--stages", "gather", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert status == summary["exit_status"] == 0 and summary["report"] == str(out)
    assert summary["classes"] == json.loads((out / "summary.json").read_text())["classes"]
    assert "replay /" in captured.err  # progress stays on stderr; stdout is the JSON alone


@pytest.mark.vllm
@pytest.mark.slow
def test_losing_the_expected_rejection_fails_the_corpus(tmp_path):
    out = tmp_path / "rep"
    # an unknown id no longer raises KeyError
    proc = mutant_cli.run(["replay", "--no-coverage", str(REGRESSIONS), "--stages", "gather", "--out", str(out), "--quiet"],
                          "getitem-to-get", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert_report_agrees(out, 1)
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    missing = classes[(classes["kind"] == "expectation_missing") & (classes["verdict"] == "new")]
    assert missing["occurrences"].sum() == 2, classes[["signature", "verdict"]]  # both gather KeyErrors
    assert "did not occur" in proc.stdout
