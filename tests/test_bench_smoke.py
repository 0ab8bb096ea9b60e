"""The benchmark suites stay runnable: every item in tests/bench runs once
(benchmarking disabled: pedantic benchmarks run one round), in a subprocess
with the options `simrig bench` uses, minus timing. A broken benchmark, a
module that no longer imports, or an item that skips fails this test; the
vLLM-driving items run too (about 10 s in all on CPU, most of it the vLLM
import)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "bench"

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_every_benchmark_item_runs_once(tmp_path) -> None:
    junit = tmp_path / "bench.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/bench", "-o", "addopts=", "-p", "no:cacheprovider",
           "--benchmark-disable", "-rfEs", f"--junitxml={junit}"]
    # once each, and small: the campaign-sized items run a few examples (their size is not asserted)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(SIMRIG_BENCH_STEER_EXAMPLES="2", SIMRIG_BENCH_COVERAGE_EXAMPLES="1")
    done = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    collected = re.search(r"^collected (\d+) items?\b(.*)$", done.stdout, re.MULTILINE)
    assert collected, tail
    # nothing after the count: no "/ 1 error", "/ 2 skipped"
    assert collected.group(2).strip() == "", f"collection: {collected.group(0)}"
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k)) for k in ("tests", "skipped", "failures", "errors")}
    # Every collected item ran and passed: none skipped, none deselected.
    assert counts == {"tests": int(collected.group(1)), "skipped": 0, "failures": 0, "errors": 0}, tail
    cases = suite.findall("testcase")
    assert len(cases) == counts["tests"]
    modules = {case.get("classname").rsplit(".", 1)[-1] for case in cases}
    assert modules == {p.stem for p in SUITE.glob("test_*.py")}, modules
    # The vLLM-driving items are among them (not only the NumPy/torch micro benchmarks).
    names = {case.get("name").split("[", 1)[0] for case in cases}
    assert {"test_stage_latency", "test_rig_overhead", "test_cudagraph_mode_cost",
            "test_replay_overhead", "test_record_steps_per_second",
            "test_campaign_steps_per_second"} <= names, names
