"""The examples run: examples/campaign_timeline.py on a small fuzz report made here.

The campaign is repeatable (--max-examples, --seed, no database) and kept small: one PCP
size, eager only, gather and prepare (about 40 s on a 2-core CPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def fuzz_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("campaign") / "report"
    env = {**os.environ, "SIMRIG_HISTORY": "none"}
    done = subprocess.run([sys.executable, "-m", "simrig.cli", "fuzz", "--max-examples", "6", "--seed", "1",
                           "--database", "none", "--no-regressions", "--coverage",
                           "--stages", "gather,prepare", "--pcp-sizes", "1", "--cudagraph-modes", "NONE",
                           "--quiet", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return out


@pytest.mark.vllm
@pytest.mark.slow
def test_campaign_timeline_plots_a_fuzz_report(fuzz_report, tmp_path):
    png = tmp_path / "timeline.png"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "campaign_timeline.py"),
                           str(fuzz_report), str(png)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert png.is_file() and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == PNG_MAGIC
    summary = json.loads((fuzz_report / "summary.json").read_text())
    printed = re.search(r"^classes: (\d+) ", done.stdout, flags=re.MULTILINE)
    assert printed, done.stdout
    assert int(printed.group(1)) == summary["classes"]["classes"]
    coverage = re.search(r"^coverage: \d+ MRV2 arcs after 6 examples$", done.stdout, flags=re.MULTILINE)
    assert coverage, done.stdout


def test_campaign_timeline_refuses_a_folder_that_is_no_report(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "campaign_timeline.py"), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no classes.parquet" in done.stderr
