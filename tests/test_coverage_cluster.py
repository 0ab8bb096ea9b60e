"""Shard coverage merges to the one-process figure on the same examples (Ray; marker cluster)."""

from __future__ import annotations

import json

import pytest

from simrig.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.cluster]


def _run(args: list[str], capsys) -> tuple[int, dict]:
    """The one-process run in a fresh interpreter, as a Ray worker is: code vLLM runs once
    per process (the Triton interpreter's first parse of each kernel) counts on both sides."""
    import subprocess
    import sys
    from pathlib import Path

    if "--workers" in args:
        status = main(args)
        capsys.readouterr()
    else:
        status = subprocess.run([sys.executable, "-m", "simrig", *args], check=False,
                                capture_output=True, timeout=600).returncode
    return status, json.loads((Path(args[args.index("--out") + 1]) / "summary.json").read_text())


def test_sharded_replay_coverage_equals_the_one_process_coverage(tmp_path, capsys, fresh_ray_workers):
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    common = ["replay", "traces/samples", "--stages", "gather,dummy", "--coverage", "--quiet", "--json",
              "--segment-steps", "100000"]  # whole traces per unit: the same steps as one process
    _, one = _run([*common, "--out", str(tmp_path / "one")], capsys)
    _, two = _run([*common, "--workers", "2", "--out", str(tmp_path / "two")], capsys)
    assert len(two["units"]) > 1  # really sharded
    a, b = one["coverage"], two["coverage"]
    assert a["lines_reached"] > 0
    for key in ("lines", "lines_reached", "branches", "branches_reached", "driven_functions",
                "unreached_lines", "unexplained_lines"):
        assert a[key] == b[key], key
    assert a["data"] == b["data"]  # the same arcs, file by file


def test_sharded_fuzz_coverage_equals_the_one_process_coverage(tmp_path, capsys, fresh_ray_workers):
    """One worker, the same seed and examples (the repeatable setting)."""
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    common = ["fuzz", "--seed", "2", "--max-examples", "4", "--steps-per-example", "6", "--pcp-sizes", "1,2",
              "--stages", "gather,dummy", "--database", "none", "--no-regressions", "--coverage",
              "--quiet", "--json"]
    _, one = _run([*common, "--out", str(tmp_path / "one")], capsys)
    _, two = _run([*common, "--workers", "1", "--out", str(tmp_path / "two")], capsys)
    assert one["steps"] == two["steps"] > 0
    assert one["coverage"]["data"] == two["coverage"]["data"]
    assert one["coverage"]["lines_reached"] == two["coverage"]["lines_reached"] > 0
