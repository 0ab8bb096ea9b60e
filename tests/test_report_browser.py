"""What the first screen of each report shows, in a real browser (headless Chromium).

A nightly owner reads one screen (1400 x 1000 px): the verdict, the new classes with their
reproducers, what changed since the previous run; never a known class's explanation. The
measuring is ``scripts/first_screen.py`` (the same script writes the README's screenshot);
its screenshots go to ``build/first-screen/`` as CI artifacts.

Without Chromium the tests skip, except under CI (``SIMRIG_CI=1``, set by ``.ci/run``, which
installs Chromium): there a missing browser fails.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simrig.findings.classes import verdict_line

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "build" / "first-screen"
TRACE = ROOT / "traces" / "samples" / "chunked_prefill.jsonl"


def _first_screen_module():
    spec = importlib.util.spec_from_file_location("first_screen", ROOT / "scripts" / "first_screen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


first_screen = _first_screen_module()


@pytest.fixture(scope="module")
def browser() -> str:
    found = first_screen.chromium()
    if found is None:
        if os.environ.get("SIMRIG_CI") == "1":
            pytest.fail("SIMRIG_CI=1 but no chromium on PATH: .ci/run installs it "
                        "(apt-get install -y chromium)")
        pytest.skip("no chromium on PATH (apt-get install -y chromium); under CI (SIMRIG_CI=1) "
                    "this fails instead")
    return found


def test_the_measure_sees_text_above_the_fold_and_not_collapsed_or_lower_text(tmp_path, browser):
    """The measuring itself: a known explanation inline at the top is seen (so the report
    tests below fail if one moves back up), one in a collapsed section or below 1,000 px is not."""
    page = tmp_path / "probe.html"
    page.write_text("<!DOCTYPE html><html><body><p class='banner'>VERDICT LINE</p>"
                    "<p>inline explanation of a known class</p>"
                    "<details><summary>3 known classes</summary><p>folded explanation</p></details>"
                    "<div style='height:1400px'></div><p>below the fold</p></body></html>")
    seen = first_screen.first_screen(page, SHOTS / "probe.png", browser)
    assert "VERDICT LINE" in seen["texts"] and "inline explanation of a known class" in seen["texts"]
    assert "3 known classes" in seen["texts"]
    assert "folded explanation" not in seen["texts"] and "below the fold" not in seen["texts"]


DRIVER = """
import os, sys
os.environ["SIMRIG_SUPERVISE"] = "0"   # the seeded fault lives in this process
from simrig.adapters.runner import load
from simrig.cli import main
from simrig.selftest.catalogue import BY_NAME
from simrig.vllm_runtime import mutate

out, trace = sys.argv[1], sys.argv[2]
quiet = ["--no-coverage", "--quiet"]
fuzz = ["fuzz", "--max-examples", "1", "--seed", "0", "--database", "none", "--no-regressions"]
load()
status = [main(["replay", trace, "--out", out + "/replay-before", *quiet]),
          main([*fuzz, "--out", out + "/fuzz-before", *quiet])]
mutate.apply(BY_NAME["idx-mapping-device-int32"])   # the device batch->slot mapping turns int32
status += [main(["replay", trace, "--out", out + "/replay", "--summary-md", out + "/replay.md", *quiet]),
           main([*fuzz, "--out", out + "/fuzz", "--summary-md", out + "/fuzz.md", *quiet]),
           main(["history", "--out", out + "/history.html"])]
print(status)
"""


@pytest.fixture(scope="module")
def seeded_reports(tmp_path_factory) -> Path:
    """A replay and a one-example campaign, each run clean and then with a seeded fault
    (so each report has a previous run of its suite), and the history page over them."""
    out = tmp_path_factory.mktemp("seeded")
    env = {**os.environ, "SIMRIG_HISTORY": str(out / "history"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(out), str(TRACE)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[0, 0, 1, 1, 0]", done.stdout[-2000:]
    return out


def _assert_first_screen(report: Path, seen: dict) -> None:
    texts = seen["texts"]
    visible = " ".join(texts)
    summary = json.loads((report / "summary.json").read_text())
    classes = pd.read_csv(report / "classes.csv", keep_default_na=False)
    assert verdict_line(summary["classes"]) in visible  # the verdict
    new = classes[classes["verdict"] == "new"]
    assert len(new), "the seeded fault makes new classes"
    for c in new.itertuples(index=False):  # every new class, with its reproducer
        assert c.signature in texts and c.reproduce in texts, c.signature
    assert "Since the previous run" in texts and "previous run of" in visible
    known = classes[(classes["verdict"] == "known") & (classes["explanation"] != "")]
    assert len(known), "a known class to keep below the fold"
    for explanation in known["explanation"]:  # no known explanation above the fold
        assert not any(explanation[:60] in t or (len(t) > 40 and t in explanation) for t in texts), explanation
    assert seen["sections"][:2] == ["new-classes", "changes"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["replay", "fuzz"])
def test_first_screen_of_a_report_with_a_seeded_fault(seeded_reports, browser, kind):
    report = seeded_reports / kind
    seen = first_screen.first_screen(report / "report.html", SHOTS / f"{kind}.png", browser)
    _assert_first_screen(report, seen)
    markdown = (seeded_reports / f"{kind}.md").read_text()
    classes = pd.read_csv(report / "classes.csv", keep_default_na=False)
    assert markdown.splitlines()[0].startswith(f"### simrig {kind}: ")
    assert verdict_line(json.loads((report / "summary.json").read_text())["classes"]) in markdown
    for c in classes[classes["verdict"] == "new"].itertuples(index=False):
        assert f"`{c.reproduce}`" in markdown
    assert "**Since the previous run**" in markdown


@pytest.mark.vllm
@pytest.mark.slow
def test_first_screen_of_the_history_page(seeded_reports, browser):
    seen = first_screen.first_screen(seeded_reports / "history.html", SHOTS / "history.png", browser)
    page = (seeded_reports / "history.html").read_text()
    banner = html.unescape(page.split("<p class='banner", 1)[1].split(">", 1)[1].split("</p>", 1)[0])
    assert banner in seen["texts"]
    assert any(t.startswith("New classes still showing (") for t in seen["texts"])
    assert "dtype_drift · prepare · idx_mapping" in seen["texts"]  # the seeded fault's class


@pytest.mark.vllm
@pytest.mark.slow
def test_first_screen_of_a_selftest_scoreboard(tmp_path, browser):
    """One mutant, scored by a short campaign: the verdict and the 'since the previous run'
    section on the first screen; a surviving mutant's class on it, a detected one's folded
    (which of the two depends on the machine's speed within the budget)."""
    out = tmp_path / "selftest"
    env = {**os.environ, "SIMRIG_HISTORY": str(tmp_path / "history"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "simrig", "selftest", "--mutants", "idx-mapping-device-int32",
                           "--fuzz-only", "--skip-baseline", "--no-memcheck", "--budget-per-mutant", "30",
                           "--out", str(out), "--summary-md", str(tmp_path / "selftest.md")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert done.returncode == summary["exit_status"] in (0, 1), done.stderr[-2000:]
    first_line = done.stdout.splitlines()[0]  # the one-line status
    assert first_line.startswith("selftest: ") and "mutants detected" in first_line
    seen = first_screen.first_screen(out / "report.html", SHOTS / "selftest.png", browser)
    assert verdict_line(summary["classes"]) in " ".join(seen["texts"])
    assert "Since the previous run" in seen["texts"]
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    assert len(classes) == 1
    row = classes.iloc[0]
    if row["verdict"] == "new":  # the mutant survived the budget: a new class, on the first screen
        assert row["signature"] in seen["texts"]
    else:  # detected: the expected class is folded, its text one click away
        assert row["verdict"] == "expected"
        assert not any(row["explanation"][:60] in t for t in seen["texts"])
    verdict = verdict_line(summary["classes"])
    assert (tmp_path / "selftest.md").read_text().startswith(f"### simrig selftest: {verdict}")
