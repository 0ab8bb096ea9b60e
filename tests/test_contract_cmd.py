"""``simrig contract snapshot`` / ``diff``: files, table, exit codes."""

from __future__ import annotations

import json

import pytest

from simrig.cli import main
from simrig.report.snapshot import load_snapshot


@pytest.fixture(scope="module")
def snapshot_file(tmp_path_factory, vllm_api):
    out = tmp_path_factory.mktemp("contract") / "snap.json"
    assert main(["contract", "snapshot", "--out", str(out)]) == 0
    return out


@pytest.mark.vllm
def test_snapshot_lists_every_stage_and_matches_the_committed_baseline(snapshot_file, capsys):
    doc = load_snapshot(snapshot_file)
    assert set(doc["stages"]) >= {"gather", "prepare", "partition", "dummy"}
    prep = doc["stages"]["prepare"]
    assert prep["idx_mapping"] == {"kind": "torch", "dtype": "int64", "declared": "torch int64"}
    assert prep["req_ids"]["declared"] is None  # outside the table, still listed
    assert doc["stages"]["partition"]["manager.padded_gather_idx"]["dtype"] == "int64"
    baseline = f"reports/baselines/contract-vllm-{doc['vllm_version']}.json"
    assert main(["contract", "diff", baseline, str(snapshot_file)]) == 0
    assert "no dtype differences" in capsys.readouterr().out


@pytest.mark.vllm
def test_diff_prints_a_table_and_exits_1(snapshot_file, tmp_path, capsys):
    doc = json.loads(snapshot_file.read_text())
    doc["vllm_version"] = "next"
    doc["stages"]["prepare"]["idx_mapping"]["dtype"] = "int32"
    del doc["stages"]["gather"]["idx_mapping_np"]
    other = tmp_path / "next.json"
    other.write_text(json.dumps(doc))
    assert main(["contract", "diff", str(snapshot_file), str(other)]) == 1
    out = capsys.readouterr().out
    assert "prepare  idx_mapping" in out and "torch int64" in out and "torch int32" in out
    assert "gather   idx_mapping_np" in out and "2 dtype difference(s)" in out


@pytest.mark.parametrize("text,where", [("{", "bad.json:1: file: invalid JSON"),
                                        ('{"format": "other"}', "bad.json:1: format"),
                                        ('{"format": "simrig-contract", "version": 1, "stages": {"x": {"f": 3}}}',
                                         "bad.json:1: stages.x.f")])
def test_diff_bad_file_is_one_line_exit_2(tmp_path, capsys, text, where):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    assert main(["contract", "diff", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and where in err


def test_diff_missing_file_exit_2(tmp_path, capsys):
    assert main(["contract", "diff", str(tmp_path / "nope.json"), str(tmp_path / "nope.json")]) == 2
    assert "nope.json:0: file" in capsys.readouterr().err
