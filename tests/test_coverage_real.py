"""Coverage of the real installed vLLM's MRV2 code, collected as the commands collect it.

The expected lines are named by their source text in the installed file (what a
reader of vLLM's code would point at), never taken from the run under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simrig.cli import main
from simrig.coverage.collect import Collector, merge, vllm_root

pytestmark = pytest.mark.vllm

TRACE = "traces/samples/chunked_prefill.jsonl"
GRAPHS = "vllm/v1/worker/gpu/cudagraph_utils.py"
# In CudaGraphManager._init_candidates, only a FULL mixed mode builds request-padded
# descriptors: `if mixed_mode == CUDAGraphMode.FULL: num_reqs = min(num_tokens, self.max_num_reqs)`.
FULL_ONLY = "num_reqs = min(num_tokens, self.max_num_reqs)"


def _line_of(rel: str, text: str) -> int:
    lines = (vllm_root() / rel).read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {rel} in this vLLM"
    return found[0]


def _replay(tmp_path: Path, name: str, *flags: str) -> tuple[int, Path]:
    out = tmp_path / name
    status = main(["replay", TRACE, "--stages", "gather", "--coverage", "--quiet", "--json",
                   "--out", str(out), *flags])
    return status, out


def test_a_line_only_one_config_reaches_is_unreached_without_that_config(vllm_api, tmp_path, capsys):
    line = _line_of(GRAPHS, FULL_ONLY)
    _, piecewise = _replay(tmp_path, "piecewise", "--cudagraph-mode", "PIECEWISE")
    _, full = _replay(tmp_path, "full", "--cudagraph-mode", "FULL")
    capsys.readouterr()

    def unreached(out: Path) -> pd.DataFrame:
        u = pd.read_parquet(out / "coverage_unreached.parquet")
        return u[(u.file == GRAPHS) & (u.line == line)]

    without = unreached(piecewise)
    assert len(without) == 1, "PIECEWISE never builds request-padded graphs: the line is unreached"
    assert without.iloc[0].function == "CudaGraphManager._init_candidates"
    assert FULL_ONLY in without.iloc[0].source
    assert unreached(full).empty, "under FULL the line is reached"
    # ... and the function table agrees: more lines of _init_candidates reached with FULL
    fns = {name: pd.read_parquet(out / "coverage_functions.parquet").set_index("function")
           for name, out in (("p", piecewise), ("f", full))}
    key = "CudaGraphManager._init_candidates"
    assert fns["f"].loc[key, "lines_reached"] > fns["p"].loc[key, "lines_reached"]
    summary = json.loads((full / "summary.json").read_text())
    assert summary["coverage"]["lines_reached"] > 0
    assert (full / "report.html").read_text().count("Coverage of the MRV2 code") == 1


def test_coverage_of_parts_merges_to_the_coverage_of_the_whole(vllm_api):
    """As shards do: each part of the examples measured on its own, merged, equals
    one collector over all of them (same process, same examples)."""
    from simrig.replay import replay_steps

    traces = ["traces/samples/chunked_prefill.jsonl", "traces/samples/spec_decode.jsonl",
              "traces/samples/pcp2.jsonl"]

    def measure(paths: list[str]) -> dict:
        collector = Collector()
        collector.start()
        try:
            for path in paths:
                for _ in replay_steps(path, api=vllm_api, stages=("gather", "dummy")):
                    pass
        finally:
            collector.stop()
        return collector.data()

    for path in traces:  # warm: first-call-only code (caches) runs before any measurement
        measure([path])
    parts = [measure([path]) for path in traces]
    whole = measure(traces)
    assert merge(parts) == whole
    assert sum(len(v) for v in whole.values()) > max(sum(len(v) for v in p.values()) for p in parts)


def test_unexplained_lines_fail_the_run_only_when_asked(vllm_api, tmp_path, capsys):
    empty = tmp_path / "none.toml"
    empty.write_text("# no reasons at all\n")
    status, out = _replay(tmp_path, "default", "--unreached", str(empty))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["coverage"]["unexplained_lines"] > 0
    assert status == 0
    u = pd.read_parquet(out / "coverage_unreached.parquet")
    assert set(u.finding_kind) == {"unexplained_coverage"}
    status, out = _replay(tmp_path, "strict", "--unreached", str(empty),
                          "--fail-on-unexplained-coverage")
    assert status == 1
    assert json.loads((out / "summary.json").read_text())["exit_status"] == 1
    capsys.readouterr()


def test_a_malformed_reasons_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[reason]]\nfile = 'x'\n")
    status = main(["replay", TRACE, "--coverage", "--unreached", str(bad), "--out",
                   str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "bad.toml: reason #0: function" in err[0]
    assert not (tmp_path / "r").exists()


def test_history_shows_a_coverage_drop_and_simrig_coverage_the_branches_never_taken(
        vllm_api, tmp_path, monkeypatch, capsys):
    store = tmp_path / "history"
    monkeypatch.setenv("SIMRIG_HISTORY", str(store))
    line = _line_of(GRAPHS, "if mixed_mode == CUDAGraphMode.FULL:")
    target = _line_of(GRAPHS, FULL_ONLY)
    _replay(tmp_path, "full", "--cudagraph-mode", "FULL")  # same suite, then less of it
    capsys.readouterr()
    assert main(["coverage", "--json"]) == 0
    only_full = json.loads(capsys.readouterr().out)
    import time

    time.sleep(1.1)  # history orders runs by their created_utc second: keep FULL strictly first
    _replay(tmp_path, "piecewise", "--cudagraph-mode", "PIECEWISE")
    capsys.readouterr()

    def never(report: dict) -> set[tuple[int, int]]:
        return {(r["line"], r["to_line"]) for r in report["never_reached"] if r["file"] == GRAPHS}

    assert (line, target) not in never(only_full), "FULL took the branch into the request padding"
    rows = pd.read_parquet(store / "coverage")
    arc = rows[(rows.file == GRAPHS) & (rows.line == line) & (rows.to_line == target)]
    # a tracked branch arc: taken by the FULL run, not by the PIECEWISE one
    assert sorted(arc.reached.tolist()) == [False, True]
    assert never(only_full), "other branches of the graph code stay untaken"
    assert main(["coverage", "--json", "--since", "2999-01-01"]) == 2  # no run with coverage then
    capsys.readouterr()
    assert main(["history", "--json"]) == 0
    history = json.loads(capsys.readouterr().out)
    drops = history["coverage_drops"]
    assert len(drops) == 1 and drops[0]["change_lines"] < 0, history["coverage"]
    assert "COVERAGE DROP" not in (store / "history.html").read_text()  # page words it as a verdict
    assert "Coverage of the MRV2 code over time" in (store / "history.html").read_text()
    # Union over both runs: the FULL run still took the branch, so it is not "never reached".
    assert main(["coverage", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert (line, target) not in never(both)
    assert both["versions"][0]["runs"] == 2
