"""simrig bisect over the commits of a vLLM checkout, and the standalone reproducer, end to end.

The checkout is built at test time from the INSTALLED vLLM's MRV2 files
(tests/vllm_git_repo.py): a regression (the device idx_mapping turned int32,
as the selftest mutant ``idx-mapping-device-int32``), its revert, unrelated
commits and one commit that does not import. Every judged commit runs in a
child process on the installed release with the commit's files overlaid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import vllm_git_repo

from simrig.bisect import gitrepo
from simrig.cli import main
from simrig.history.store import class_timeline, load_history

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
CLASS = "dtype_drift:prepare:idx_mapping"
TRACE = ({"format": "simrig-trace", "version": 1,
          "config": {"max_num_reqs": 4, "max_num_batched_tokens": 32, "max_model_len": 64},
          "source": {"kind": "hand-written", "signature": ["dtype_drift", "prepare", "idx_mapping", ""]}},
         {"step": 0, "new_requests": [{"id": "a", "prompt_len": 3}, {"id": "b", "prompt_len": 5}],
          "num_scheduled_tokens": {"a": 3, "b": 5}},
         {"step": 1, "cached_requests": [{"id": "a", "num_computed_tokens": 3},
                                         {"id": "b", "num_computed_tokens": 5}],
          "num_scheduled_tokens": {"a": 1, "b": 1}})


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-checkout")
    commits = vllm_git_repo.build(root / "vllm")
    trace = root / "idx_mapping.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in TRACE))
    return root / "vllm", commits, trace, root


@pytest.fixture(scope="module")
def bisected(checkout, tmp_path_factory):
    repo, c, trace, root = checkout
    out, history = root / "report", root / "history"
    env = {**os.environ, "SIMRIG_HISTORY": str(history)}
    proc = subprocess.run(
        [sys.executable, "-m", "simrig", "bisect", str(trace), "--repo", str(repo), "--good", c["c0"],
         "--bad", c["c6"], "--good", c["c9"], "--cache", str(root / "cache"), "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT)
    return proc, out, history


def test_bisect_names_the_introducing_and_the_fixing_commit_and_skips_the_broken_one(checkout, bisected):
    repo, c, _, _ = checkout
    proc, out, _ = bisected
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    introduced, fixed = summary["legs"]
    assert (introduced["direction"], introduced["first_new_ident"], introduced["last_old_ident"]) == \
        ("introduced", c["c5"], c["c4"])
    assert (fixed["direction"], fixed["first_new_ident"], fixed["last_old_ident"]) == ("fixed", c["c8"], c["c7"])
    assert not introduced["ambiguous"] and not fixed["ambiguous"]
    steps = pd.read_csv(out / "steps.csv", keep_default_na=False)
    verdict = dict(zip(steps["ident"], steps["verdict"]))
    assert verdict[c["c3"]] == "skip"  # does not import: judged, skipped, never blamed
    assert "simrig_no_such_helper" in steps.set_index("ident").loc[c["c3"], "reason"]
    assert verdict[c["c5"]] == "bad" and verdict[c["c4"]] == "good" and verdict[c["c8"]] == "good"
    assert c["c1"] not in set(steps["ident"])  # an inner docs-only commit: never run
    assert summary["legs"][0]["commits_in_range"] == 7 and summary["legs"][0]["points"] == 6
    assert introduced["changed_files"] == [{"status": "M", "path": "vllm/v1/worker/gpu/model_runner.py",
                                           "mentions_field": 2, "with_dtype": 2}]
    diff = (out / "leg-0.diff").read_text()
    assert any(ln.startswith("-") and vllm_git_repo.REGRESSION_OLD in ln for ln in diff.splitlines())
    assert any(ln.startswith("+") and vllm_git_repo.REGRESSION_NEW in ln for ln in diff.splitlines())
    assert f"introduced in {gitrepo.short(c['c5'])}" in proc.stdout
    assert "report.html" in proc.stdout and (out / "report.html").read_text().count("<table>") >= 2


def test_the_bisection_is_in_the_history_as_introduced_in(checkout, bisected):
    _, c, _, _ = checkout
    _, _, history = bisected
    runs, classes = load_history(history)
    run = runs[runs["command"] == "bisect"].iloc[-1]
    summary = json.loads(run["summary_json"])
    assert (summary["introduced_in"], summary["fixed_in"]) == (gitrepo.short(c["c5"]), gitrepo.short(c["c8"]))
    # a later replay that shows the class gets the bisection on its class line
    from simrig.history.store import append_run

    seen = pd.DataFrame([{"signature": "dtype_drift · prepare · idx_mapping", "kind": "dtype_drift",
                          "stage": "prepare", "field": "idx_mapping", "exception_type": "",
                          "verdict": "new", "occurrences": 2}])
    append_run(history, {"command": "replay", "suite": "replay t", "vllm_version": "x"}, seen)
    runs, classes = load_history(history)
    line = class_timeline(runs, classes).set_index("signature").loc["dtype_drift · prepare · idx_mapping"]
    assert (line["introduced_in"], line["fixed_in"]) == (gitrepo.short(c["c5"]), gitrepo.short(c["c8"]))


def _pytest_on_commit(repo: Path, commit: str, file: Path, cache: Path) -> subprocess.CompletedProcess:
    folder, _ = gitrepo.materialize(repo, commit, ("vllm/v1/worker/gpu",), cache)
    env = {**os.environ, "SIMRIG_OVERLAY": str(folder), "SIMRIG_OVERLAY_PATHS": "vllm/v1/worker/gpu"}
    return subprocess.run([sys.executable, "-m", "simrig.vllm_runtime.overlay", "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", "-p", "no:simrig", "-c", os.devnull,
                           "--rootdir", str(file.parent), str(file)],
                          capture_output=True, text=True, env=env, cwd=file.parent)


def test_the_standalone_file_fails_before_the_fix_and_passes_after_it(checkout, tmp_path):
    repo, c, trace, root = checkout
    file = tmp_path / "test_idx_mapping.py"
    assert main(["repro", str(trace), "--pytest", str(file)]) == 0  # the class from the header
    before = _pytest_on_commit(repo, c["c5"], file, root / "cache")
    assert before.returncode == 1, before.stdout[-3000:]
    assert "execute_model: InputBatch.idx_mapping is torch.int32, expected torch.int64" in before.stdout
    after = _pytest_on_commit(repo, c["c8"], file, root / "cache")
    assert after.returncode == 0, after.stdout[-3000:]
    assert "1 passed" in after.stdout
