"""compare's statistics and tables, on hand-made inputs (no vLLM needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simrig.bench.stats import FASTER, NOISE, SLOWER, TOO_FEW, bootstrap_ratio
from simrig.errors import UsageError
from simrig.releases import diff
from simrig.releases.envs import resolve_spec


def test_a_clear_slowdown_is_slower_and_identical_noise_is_within_noise():
    rng = np.random.default_rng(1)
    a = 1.0 + rng.normal(0, 0.02, 8)
    assert bootstrap_ratio(a, a * 1.5).verdict == SLOWER
    assert bootstrap_ratio(a, a * 0.7).verdict == FASTER
    # the same load hits both sides of a round: a 2x swing between rounds is not a change
    load = np.array([1.0, 2.0, 1.0, 1.9, 1.1, 2.0])
    r = bootstrap_ratio(load, load * rng.normal(1.0, 0.01, 6))
    assert r.verdict == NOISE and r.low < 1 < r.high


def test_a_ratio_needs_three_rounds_and_equal_lengths():
    assert bootstrap_ratio([1.0, 1.0], [2.0, 2.0]).verdict == TOO_FEW
    with pytest.raises(ValueError, match="same positive number"):
        bootstrap_ratio([1.0, 2.0, 3.0], [1.0, 2.0])


def test_class_diff_sides():
    cols = ["kind", "stage", "field", "check", "exception_type", "count", "known", "known_by"]
    a = pd.DataFrame([["dtype_drift", "dummy", "logits_indices", "parity", "", 5, True, "k.json#0"],
                      ["exception", "prepare", "", "runner", "TypeError", 1, False, ""]], columns=cols)
    b = pd.DataFrame([["dtype_drift", "dummy", "logits_indices", "parity", "", 7, True, "k.json#0"],
                      ["key_error", "gather", "", "runner", "KeyError", 2, False, ""]], columns=cols)
    out = diff.class_diff(a, b)
    sides = dict(zip(out["kind"], out["side"]))
    assert sides == {"dtype_drift": diff.BOTH, "exception": diff.A_ONLY, "key_error": diff.B_ONLY}
    both = out[out["side"] == diff.BOTH].iloc[0]
    assert (both["count_a"], both["count_b"]) == (5, 7)


def test_contract_diff_compares_only_fields_both_sides_have():
    cols = ["stage", "field", "kind", "dtype"]
    a = pd.DataFrame([["prepare", "idx_mapping", "torch", "int64"],
                      ["dummy", "logits_indices", "torch", "int32"],
                      ["prepare", "dcp_local_seq_lens_cpu_upper_bound", "numpy", "int32"]], columns=cols)
    b = pd.DataFrame([["prepare", "idx_mapping", "torch", "int32"],
                      ["dummy", "logits_indices", "torch", "int32"],
                      ["prepare", "num_admitted_draft_tokens", "torch", "int32"]], columns=cols)
    status = dict(zip(diff.contract_diff(a, b)["field"], diff.contract_diff(a, b)["status"]))
    assert status == {"idx_mapping": diff.DIFFERS, "logits_indices": diff.SAME,
                      "dcp_local_seq_lens_cpu_upper_bound": diff.A_ONLY,
                      "num_admitted_draft_tokens": diff.B_ONLY}


def test_value_diff_counts_steps_where_shared_fields_differ():
    cols = ["trace", "pcp_size", "step", "stage", "rank", "field", "digest"]
    a = pd.DataFrame([["t", 1, 0, "prepare", -1, "positions", "x"],
                      ["t", 1, 1, "prepare", -1, "positions", "y"],
                      ["t", 1, 0, "prepare", -1, "only_a", "z"]], columns=cols)
    b = pd.DataFrame([["t", 1, 0, "prepare", -1, "positions", "x"],
                      ["t", 1, 1, "prepare", -1, "positions", "CHANGED"]], columns=cols)
    rows, compared = diff.value_diff(a, b)
    assert compared == 1  # only_a is on one side: never compared
    assert rows[["field", "differing", "compared", "first_step"]].values.tolist() == [["positions", 1, 2, 1]]


@pytest.mark.parametrize("spec, match", [
    ("banana", "not a release"),
    ("0.20.0", "no Model Runner V2"),
    ("./no/such/path.whl", "not a release"),
])
def test_bad_vllm_specs_are_one_line_usage_errors(spec, match):
    with pytest.raises(UsageError, match=match):
        resolve_spec(spec)


def test_a_release_spec_names_its_side_venv():
    side = resolve_spec("0.31.0")
    assert side.kind == "release" and side.venv.name == "vllm-0.31.0" and side.source == "vllm==0.31.0"


def test_latency_compares_only_work_both_sides_did():
    from simrig.releases.side import SEP

    # B also partitions a trace A cannot (an unavailable stage): that time is left out
    a = [{f"partition{SEP}pcp2": 1.0, f"prepare{SEP}t": 2.0} for _ in range(4)]
    b = [{f"partition{SEP}pcp2": 1.0, f"partition{SEP}shard": 3.0, f"prepare{SEP}t": 2.0}
         for _ in range(4)]
    frame, unshared = diff.latency(a, b)
    ratios = dict(zip(frame["stage"], frame["ratio_b_over_a"]))
    assert ratios == {"partition": 1.0, "prepare": 1.0}
    assert unshared == ["partition on shard (B only)"]


def test_value_digest_ignores_dtype_but_not_values_or_shape():
    from simrig.observe import FieldObs
    from simrig.releases.side import digest

    def obs(arr):
        return FieldObs("torch", arr.dtype.name, arr.shape, arr)

    base = digest(obs(np.arange(6, dtype=np.int64)))
    assert digest(obs(np.arange(6, dtype=np.int32))) == base  # a dtype change is the contract's business
    assert digest(obs(np.arange(1, 7, dtype=np.int64))) != base
    assert digest(obs(np.arange(6, dtype=np.int64).reshape(2, 3))) != base


def test_a_layered_side_venv_installs_only_vllm_and_reads_the_rest_from_the_project_venv(tmp_path, monkeypatch):
    import subprocess
    import sys

    from simrig.releases import envs

    steps = envs.pip_steps(resolve_spec("0.31.0"), layered=True)
    assert len(steps) == 1 and "--no-deps" in steps[0] and "vllm==0.31.0" in steps[0]
    assert not any("torch-cpu.txt" in arg for arg in steps[0])
    pip_calls = []

    def run(cmd, side):  # the venv is really made; pip (the download) is not run
        if cmd[1:3] == ["-m", "venv"]:
            subprocess.run(cmd, check=True)
        else:
            pip_calls.append(cmd)

    monkeypatch.setattr(envs, "_run", run)
    side = envs.SideSpec("0.31.0", "release", tmp_path / "vllm-0.31.0", "vllm==0.31.0")
    envs.create(side, layered=True, log=lambda line: None)
    assert len(pip_calls) == 1 and (side.venv / ".simrig-installed").exists()
    # uv where the bootstrap put it beside the interpreter, into the side's own python; else its pip
    uv = Path(sys.executable).with_name("uv")
    head = ([str(uv), "pip", "install", "--python", str(side.venv / "bin" / "python")] if uv.exists()
            else [str(side.venv / "bin" / "pip"), "install"])
    assert pip_calls[0][:len(head)] == head and "vllm==0.31.0" in pip_calls[0], pip_calls
    assert "--no-deps" in pip_calls[0]
    probe = subprocess.run([side.python, "-c", "import sys, simrig; print(simrig.__file__); print(sys.path)"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert probe[0].startswith(str(envs.PROJECT))  # simrig (editable) comes from the project venv
    paths = eval(probe[1])  # noqa: S307 -- the side interpreter's own repr of sys.path
    own, below = str(envs._site_packages(side.python)), str(envs._site_packages(sys.executable))
    assert paths.index(own) < paths.index(below)  # the side's vLLM shadows the project's
