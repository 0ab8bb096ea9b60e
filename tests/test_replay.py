"""`simrig replay`: streaming replay, report files, and one-line input errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simrig import observe as obs
from simrig.cli import main
from simrig.errors import UsageError
from simrig.progress import PLAIN, QUIET, TTY, Progress
from simrig.replay import (
    BatchTracker,
    expand_trace_paths,
    parse_pcp_sizes,
    parse_stages,
    replay_trace,
    replay_traces,
)
from simrig.report.tables import ColumnTable
from simrig.report.writer import REPORT_FILES, write_report
from simrig.step import Step
from simrig.trace_io.trace import TraceError, read_trace

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "traces" / "samples"
MALFORMED = Path(__file__).resolve().parent / "malformed"
CHEAP = ("gather", "dummy")  # no Triton-interpreted prepare: fast on CPU


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------- input errors (no vLLM needed)
@pytest.mark.parametrize("name", sorted(p.name for p in MALFORMED.iterdir()))
def test_malformed_trace_exits_2_with_one_line_and_no_report(name, tmp_path, capsys):
    out = tmp_path / "report"
    status = main(["replay", str(MALFORMED / name), "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert status == 2
    line = _one_error_line(captured.err)
    assert line.startswith(f"simrig replay: error: {MALFORMED / name}:")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary report either


def test_bad_second_file_fails_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "report"
    out.mkdir()
    status = main(["replay", str(SAMPLES / "chunked_prefill.jsonl"),
                   str(MALFORMED / "unknown_cached_id.jsonl"), "--out", str(out)])
    captured = capsys.readouterr()
    assert status == 2
    line = _one_error_line(captured.err)
    assert f"{MALFORMED / 'unknown_cached_id.jsonl'}:4: cached_requests[1].id:" in line
    assert list(out.iterdir()) == []
    assert captured.out == ""  # no summary: nothing was replayed


def test_malformed_trace_as_a_real_process(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "simrig", "replay", str(MALFORMED / "negative_tokens.jsonl"),
         "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    line = _one_error_line(proc.stderr)
    assert line == (f"simrig replay: error: {MALFORMED / 'negative_tokens.jsonl'}:3: "
                    "num_scheduled_tokens.r1: must be >= 1, got -3")
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["--pcp-sizes", "1,x"], "--pcp-sizes: 'x' is not a positive integer"),
    (["--pcp-sizes", "0"], "--pcp-sizes: '0' is not a positive integer"),
    (["--stages", "gather,bogus"], "--stages: unknown stage 'bogus'"),
    (["--stages", "gather,partition"], "--stages: partition needs prepare"),
])
def test_bad_options_exit_2(argv, message, tmp_path, capsys):
    status = main(["replay", str(SAMPLES), "--out", str(tmp_path / "r"), *argv])
    assert status == 2
    assert message in _one_error_line(capsys.readouterr().err)


def test_missing_trace_and_foreign_out_dir_exit_2(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r")]) == 2
    assert "no such trace file or directory" in _one_error_line(capsys.readouterr().err)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["replay", str(SAMPLES), "--out", str(foreign)]) == 2
    assert "not a simrig report" in _one_error_line(capsys.readouterr().err)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


# ------------------------------------------------------------- small pieces
def test_expand_directories_to_sorted_trace_files(tmp_path):
    for name in ("b.jsonl.zst", "a.jsonl", "c.jsonl.gz", "notes.md", "d.json"):
        (tmp_path / name).write_text("")
    assert expand_trace_paths([tmp_path, tmp_path / "a.jsonl"]) == [
        tmp_path / "a.jsonl", tmp_path / "b.jsonl.zst", tmp_path / "c.jsonl.gz", tmp_path / "a.jsonl"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="holds no"):
        expand_trace_paths([empty])


def test_option_parsers():
    assert parse_pcp_sizes("1,2,4,2") == [1, 2, 4]
    assert parse_pcp_sizes(None) is None
    assert parse_stages(None) == obs.OPTIONAL_STAGES
    assert parse_stages("dummy,gather") == ("gather", "dummy")


def test_column_table_chunks_and_categories():
    table = ColumnTable({"name": "str", "n": "int64", "ms": "float64"}, chunk_rows=3)
    for i in range(7):
        table.append_values(f"r{i % 2}", i, i / 2)
    frame = table.to_frame()
    table.append({"name": "r9", "n": 7})
    assert list(frame["name"].astype(str)) == ["r0", "r1"] * 3 + ["r0"]
    assert list(frame["n"]) == list(range(7)) and frame["n"].dtype == "int64"
    assert list(frame["name"].cat.categories) == ["r0", "r1"]
    again = table.to_frame()
    assert len(again) == 8 and again["name"].iloc[-1] == "r9" and pd.isna(again["ms"].iloc[-1])
    assert ColumnTable({"a": "str"}).to_frame().shape == (0, 1)
    dynamic = ColumnTable()
    dynamic.append({"kind": "key_error", "step": 3, "known": False})
    assert dict(dynamic.to_frame().dtypes.astype(str)) == {
        "kind": "category", "step": "int64", "known": "bool"}


def test_batch_tracker_labels_decode_prefill_and_drafts():
    expected = {
        "spec_decode.jsonl": [(0, 2, 0), (2, 0, 4), (2, 1, 4), (3, 0, 4), (2, 0, 4), (1, 0, 0)],
        "preempt_resume.jsonl": [(0, 2, 0), (2, 0, 0), (2, 1, 0), (2, 0, 0), (2, 1, 0),
                                 (3, 0, 0), (1, 0, 0), (1, 1, 0), (1, 0, 0)],
        "chunked_prefill.jsonl": [(0, 3, 0), (2, 2, 0), (3, 1, 0), (4, 0, 0), (3, 0, 0),
                                  (1, 0, 0)],
    }
    for name, per_step in expected.items():
        tracker = BatchTracker()
        _, steps = read_trace(SAMPLES / name)
        assert [tracker.observe(s) for s in steps] == per_step, name
    # ids never added: labelled by size alone
    assert BatchTracker().observe(Step(num_scheduled_tokens={"x": 1, "y": 9})) == (1, 1, 0)


def test_progress_modes():
    plain = io.StringIO()
    p = Progress(plain, mode=PLAIN, interval_s=0.0, total=10)
    p.begin("t.jsonl pcp=2")
    p.update(3, 2, 1)
    p.close()
    lines = plain.getvalue().splitlines()
    assert len(lines) == 3 and "step 3/10" in lines[-1] and "findings 2 (1 new)" in lines[-1]
    tty = io.StringIO()
    p = Progress(tty, mode=TTY)
    p.begin("t")
    p.update(1, 0, 0)
    p.close()
    assert tty.getvalue().startswith("\r") and tty.getvalue().endswith("\n")
    quiet = io.StringIO()
    p = Progress(quiet, mode=QUIET, interval_s=0.0)
    p.begin("t")
    p.update(5, 5, 5)
    p.close()
    assert quiet.getvalue() == ""


def _tiny_frames():
    steps = pd.DataFrame({"trace": ["t"] * 4, "pcp_size": [1] * 4, "step": [0, 0, 1, 1],
                          "stage": ["lifecycle", "gather", "lifecycle", "gather"],
                          "num_decode": [0, 0, 1, 1], "num_prefill": [1, 1, 0, 0],
                          "num_spec_tokens": [0] * 4, "num_tokens": [4, 4, 1, 1],
                          "num_reqs": [1] * 4, "duration_ms": [0.1, 0.2, 0.1, 0.3]})
    findings = pd.DataFrame({"kind": ["key_error"], "known": [False], "step": [1],
                             "message": ["<b>KeyError</b> 'ghost'"]})
    contract = pd.DataFrame({"stage": ["gather"], "field": ["idx_mapping_np"], "kind": ["numpy"],
                             "dtype": ["int64"], "count": [2]})
    return steps, findings, contract


def test_report_write_is_atomic_and_replaces_an_earlier_report(tmp_path, monkeypatch):
    steps, findings, contract = _tiny_frames()
    out = tmp_path / "rep"
    write_report(out, steps, findings, contract, {"new": 1},
                 extra_tables={"campaign": pd.DataFrame({"seed": [1, 2]})})
    assert {p.name for p in out.iterdir()} == set(REPORT_FILES) | {"campaign.parquet", "campaign.csv"}
    html = (out / "report.html").read_text()
    assert html.count("<img") == 2 and "&lt;b&gt;KeyError" in html and "<b>KeyError" not in html
    # an interrupted rewrite leaves the earlier report whole and no temporary dirs
    import simrig.report.writer

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(simrig.report.writer, "render_html", boom)
    with pytest.raises(KeyboardInterrupt):
        write_report(out, steps, findings, contract, {"new": 0})
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]
    assert json.loads((out / "summary.json").read_text())["new"] == 1
    monkeypatch.undo()
    write_report(out, steps, findings.iloc[:0], contract, {"new": 0})
    assert json.loads((out / "summary.json").read_text())["new"] == 0
    assert "campaign.csv" not in {p.name for p in out.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


# ------------------------------------------------------- real vLLM replays
@pytest.mark.vllm
def test_clean_sample_replays_to_exit_0_with_a_full_report(vllm_api, tmp_path, capsys):
    out = tmp_path / "rep"
    trace = SAMPLES / "chunked_prefill.jsonl"
    status = main(["replay", "--no-coverage", str(trace), "--pcp-sizes", "1,2", "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert status == 0, captured.out
    assert "replayed 12 steps from 1 trace(s) (pcp sizes 1,2)" in captured.out
    assert f"report: {out / 'report.html'}" in captured.out
    assert captured.err.count("replay ") == 0  # --quiet: no progress lines
    for name in ("steps", "findings", "contract"):
        assert pd.read_parquet(out / f"{name}.parquet").shape == pd.read_csv(out / f"{name}.csv").shape
    steps = pd.read_parquet(out / "steps.parquet")
    assert sorted(steps["pcp_size"].unique()) == [1, 2]
    per_step = steps[steps["stage"] != "profile"].groupby(["pcp_size", "step"]).size()
    # lifecycle, gather, dispatch, prepare, postprocess, dummy (+ one partition per rank at pcp 2)
    assert set(per_step.loc[1]) == {6} and set(per_step.loc[2]) == {8}
    profile = steps[steps["stage"] == "profile"]  # the profile run, once per runner, before step 0
    assert len(profile) == 2 and set(profile["step"]) == {0}
    part = steps[steps["stage"] == "partition"]
    assert set(part["rank"]) == {0, 1} and set(part["pcp_size"]) == {2}
    assert (steps["error"].fillna("") == "").all()
    first = steps[(steps["pcp_size"] == 1) & (steps["stage"] == "lifecycle")].iloc[0]
    assert (first["num_reqs"], first["num_tokens"], first["num_new"], first["num_prefill"]) == (3, 64, 3, 3)
    contract = pd.read_parquet(out / "contract.parquet")
    row = contract[(contract["stage"] == "prepare") & (contract["field"] == "idx_mapping")]
    assert len(row) == 1 and row["count"].iloc[0] == 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["new"] == 0 and summary["vllm_version"] == vllm_api.version
    assert summary["pcp_sizes"] == [1, 2] and summary["steps_per_s"] > 0
    assert "<img" in (out / "report.html").read_text()


def _mask_dummy_ids(findings: pd.DataFrame) -> pd.DataFrame:
    out = findings.copy()
    ids = out["req_ids"].astype(str)
    out["req_ids"] = ids.where(~ids.str.contains(r"(?:^|,)req_\d+_[0-9a-f]{16}"), "<dummy ids>")
    return out


@pytest.mark.vllm
def test_same_trace_same_tables_apart_from_timing(vllm_api, tmp_path):
    runs = [replay_trace(SAMPLES / "preempt_resume.jsonl", stages=CHEAP) for _ in range(2)]
    a, b = (r.steps.drop(columns=["duration_ms"]) for r in runs)
    pd.testing.assert_frame_equal(a, b)
    # InputBatch.make_dummy names its requests req_<i>_<random uuid> (vLLM's own
    # choice), so findings naming dummy-batch ids differ in those ids only.
    f0, f1 = (_mask_dummy_ids(r.findings) for r in runs)
    pd.testing.assert_frame_equal(f0, f1)
    pd.testing.assert_frame_equal(runs[0].contract, runs[1].contract)
    for i, r in enumerate(runs):
        write_report(tmp_path / str(i), r.steps.drop(columns=["duration_ms"]),
                     _mask_dummy_ids(r.findings),
                     r.contract, {})
    for name in ("steps.csv", "findings.csv", "contract.csv"):
        assert (tmp_path / "0" / name).read_bytes() == (tmp_path / "1" / name).read_bytes()


@pytest.mark.vllm
def test_malformed_line_mid_replay_raises_trace_error(vllm_api):
    """Without the CLI's up-front scan, streaming stops at the bad line."""
    with pytest.raises(TraceError, match=r"unknown_field\.jsonl:4: num_sched_tokens: unknown field"):
        replay_traces([MALFORMED / "unknown_field.jsonl"], stages=CHEAP)


@pytest.mark.vllm
def test_never_added_id_is_recorded_where_the_runner_raised(vllm_api, ghost_trace):
    result = replay_trace(ghost_trace, stages=CHEAP)
    gather = result.steps[(result.steps["stage"] == "gather")]
    assert list(gather["error"].astype(str)) == ["", "KeyError"]


@pytest.mark.vllm
def test_never_added_id_gives_a_key_error_finding_naming_it(vllm_api, tmp_path, capsys, ghost_trace):
    trace = ghost_trace
    out = tmp_path / "rep"
    status = main(["replay", "--no-coverage", str(trace), "--stages", "gather,dummy", "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    findings = pd.read_csv(out / "findings.csv", keep_default_na=False)
    key_errors = findings[findings["kind"] == "key_error"]
    assert len(key_errors) >= 1, printed
    assert "ghost-7" in key_errors["req_ids"].iloc[0].split(",")
    assert key_errors["step"].iloc[0] == 1 and key_errors["stage"].iloc[0] == "gather"
    assert status == (1 if (~findings["known"].astype(bool)).any() else 0)
    # one input violation is one class: the runner's KeyError follows from it
    assert "contract_violation_input at step 1 lifecycle" in printed
    assert key_errors["caused_by"].iloc[0] == "contract_violation_input · lifecycle · unknown_scheduled_id at step 1"
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    assert list(classes[classes["verdict"] == "new"]["signature"]) == [
        "contract_violation_input · lifecycle · unknown_scheduled_id"]
