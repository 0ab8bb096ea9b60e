"""The mutation engine and one cheap mutant end to end."""

from __future__ import annotations

import pandas as pd
import pytest
from test_report_agreement import assert_report_agrees

from simrig.cli import main
from simrig.selftest.catalogue import CATALOGUE, Mutant
from simrig.vllm_runtime import mutate

pytestmark = pytest.mark.vllm


def test_catalogue_is_large_and_named():
    names = [m.name for m in CATALOGUE]
    assert len(names) == len(set(names))
    assert sum(not m.equivalent and not m.control for m in CATALOGUE) >= 12
    assert all(m.description for m in CATALOGUE)


def test_every_mutant_applies_to_the_installed_source(vllm_api):
    for mutant in CATALOGUE:
        source = mutate.mutated_source(mutant)
        assert mutant.new in source, mutant.name


def test_stale_edit_is_named(vllm_api):
    stale = Mutant("stale", "vllm.v1.worker.gpu.model_runner", "sort_batch_req_ids",
                   "this line is not in vLLM", "x", "a mutant whose target moved")
    with pytest.raises(mutate.MutantError, match="stale: the edit matches 0 places"):
        mutate.mutated_source(stale)


@pytest.mark.slow
def test_one_cheap_mutant_end_to_end(tmp_path, capsys):
    out = tmp_path / "board"
    status = main(["selftest", "--mutants", "idx-mapping-host-int32", "--budget-per-mutant", "90",
                   "--skip-baseline", "--out", str(out)])
    assert status == 0, capsys.readouterr()
    board = pd.read_csv(out / "scoreboard.csv")
    row = board.set_index("mutant").loc["idx-mapping-host-int32"]
    assert row.status == "detected"
    assert row.kind == "dtype_drift"
    assert "idx_mapping_np" in row.signature
    assert (out / "report.html").read_text().count("idx-mapping-host-int32") >= 1
    summary = assert_report_agrees(out, 0)
    assert summary["classes"]["expected"] == 1  # the detected mutant's class


def test_unknown_mutant_is_a_usage_error(capsys):
    assert main(["selftest", "--mutants", "no-such-mutant"]) == 2
    err = capsys.readouterr().err
    assert "unknown mutant(s) no-such-mutant" in err and "Traceback" not in err


@pytest.mark.slow
def test_fuzz_phase_detects_a_mutant_when_no_trace_does(tmp_path):
    from simrig.selftest.mutant_runs import run_child

    result = run_child("sort-key-prefill-first", budget_s=60, seed=0, baseline=[], traces=[],
                       out_dir=tmp_path, timeout_s=300)
    assert result.error == ""
    assert result.detected and result.via == "fuzz:valid"
    assert result.kind == "value_mismatch"
    assert result.examples_to_detection >= 1
    assert 1 <= result.shrunk_steps <= 3


@pytest.mark.slow
def test_control_mutant_survives_the_adversarial_regressions_without_a_baseline(tmp_path):
    """With no baseline classes at all (what --skip-baseline gave before), replaying the
    adversarial regression traces must not 'detect' a no-op edit: their KeyErrors are
    loud rejections, the known findings are known."""
    from pathlib import Path

    from simrig.selftest.mutant_runs import run_child

    traces = sorted(Path("traces/regressions").glob("*.jsonl"))
    assert traces
    result = run_child("control-noop", budget_s=4, seed=0, baseline=[], traces=traces,
                       out_dir=tmp_path, timeout_s=300)
    assert result.error == "" and result.applied
    assert not result.detected, result.message
