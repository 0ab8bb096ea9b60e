"""The benchmark suites stay runnable: the micro benchmarks' test functions run
once each (benchmarking disabled) at their smallest sizes, in a subprocess with
the same pytest options `simrig bench` uses, minus timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_micro_benchmarks_run() -> None:
    cmd = [sys.executable, "-m", "pytest", "tests/bench/test_micro_mapping.py",
           "tests/bench/test_micro_indexing.py", "-o", "addopts=", "-p", "no:cacheprovider",
           "--benchmark-disable", "-q", "-k", "n8 or n256"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    # 4 mapping methods at n=8, and every indexing case at n=256:
    # 2 numpy + 4 torch + 2 host-to-device.
    assert "16 passed" in done.stdout, done.stdout[-2000:]
