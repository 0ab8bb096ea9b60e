"""Ctrl-C keeps what was found, and two runs sharing one report folder never lose a report.

The fuzz campaign's own cases live in tests/test_fuzz_robust.py; here: the
StopRequests rules, replay and selftest under Ctrl-C, and write_report /
swap_into_place under two processes writing the same OUT.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from simrig.interrupt import StopRequests

ROOT = Path(__file__).resolve().parents[1]


def _interrupt_me() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_first_signal_requests_a_stop_second_raises_shield_ignores():
    before = signal.getsignal(signal.SIGINT)
    calls = []
    with StopRequests(on_first=lambda: calls.append(1)) as stop:
        assert not stop.requested
        _interrupt_me()
        assert stop.requested and calls == [1]
        with stop.shield():
            _interrupt_me()  # ignored while the report is written
            _interrupt_me()
        assert not stop.abandon
        with pytest.raises(KeyboardInterrupt):
            _interrupt_me()
        assert stop.abandon and calls == [1]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_polling_driver_gets_abandon_instead_of_an_exception():
    with StopRequests(second_raises=False) as stop:
        _interrupt_me()
        _interrupt_me()
        assert stop.requested and stop.abandon


# ------------------------------------------------------------------ selftest
def _child_result(name: str):
    from simrig.selftest.mutant_runs import ChildResult

    return ChildResult(mutant=name, applied=True, detected=name != "baseline", via="fuzz:valid",
                       phase="fuzz-valid", seconds_to_detection=1.0, kind="dtype_drift",
                       shrunk_steps=2)


def test_selftest_ctrl_c_keeps_the_mutants_finished(tmp_path, monkeypatch, capsys):
    """The first Ctrl-C (here: during the first mutant) lets that mutant finish,
    runs no further one, and writes the scoreboard of what finished; a Ctrl-C
    while the scoreboard is written is ignored. Exit 130, no history row."""
    from simrig import cli
    from simrig.report import writer
    from simrig.selftest import mutant_runs

    ran = []

    def fake_child(mutant, **kwargs):
        ran.append(mutant)
        if mutant != mutant_runs.BASELINE:
            _interrupt_me()
        return _child_result(mutant)

    real_write = writer.write_report

    def write_under_fire(*args, **kwargs):
        _interrupt_me()  # a second Ctrl-C while the report is being written
        return real_write(*args, **kwargs)

    monkeypatch.setattr(mutant_runs, "run_child", fake_child)
    monkeypatch.setattr(writer, "write_report", write_under_fire)
    monkeypatch.setenv("SIMRIG_HISTORY", str(tmp_path / "history"))
    names = ["idx-mapping-host-int32", "idx-mapping-device-int32", "control-noop"]
    out = tmp_path / "board"
    status = cli.main(["selftest", "--mutants", ",".join(names), "--budget-per-mutant", "5",
                       "--fuzz-only", "--out", str(out), "--quiet"])
    assert status == 130
    assert ran == [mutant_runs.BASELINE, names[0]]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "signal" and summary["exit_status"] == 130
    assert summary["not_run"] == names[1:]
    board = pd.read_csv(out / "scoreboard.csv")
    assert list(board.mutant) == [mutant_runs.BASELINE, names[0]]
    assert not (tmp_path / "history").exists()
    assert "INTERRUPTED" in (out / "report.html").read_text()


# ------------------------------------------------------------------ replay
@pytest.mark.vllm
@pytest.mark.slow
def test_replay_ctrl_c_writes_every_step_replayed_so_far(tmp_path):
    out = tmp_path / "r"
    env = {**os.environ, "SIMRIG_HISTORY": str(tmp_path / "history")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "simrig", "replay", "--no-coverage", str(ROOT / "traces" / "recorded"),
         "--pcp-sizes", "1,2,4", "--progress", "plain", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    for line in proc.stderr:  # a progress line after the first steps ran
        if re.search(r" step [1-9][0-9]*/", line):
            break
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # abandons the step in flight, or arrives while writing
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "signal" and summary["exit_status"] == 130
    steps = pd.read_parquet(out / "steps.parquet")
    replayed = steps.drop_duplicates(["trace", "pcp_size", "step"]).shape[0]
    assert 0 < replayed == summary["steps"]
    assert summary["steps"] < 3 * 598  # the three PCP sizes of the recorded corpus were not all run
    assert stdout.startswith("INTERRUPTED: replayed ")
    assert not (tmp_path / "history").exists()


# ------------------------------------------------------------------ one OUT, two runs
def _write_reports(out: str, tag: str, times: int, errors) -> None:
    from simrig.report.writer import write_report

    frame = pd.DataFrame({"x": [1, 2]})
    for i in range(times):
        try:
            write_report(out, frame, pd.DataFrame(), pd.DataFrame(),
                         {"command": "test", "writer": tag, "round": i})
        except Exception as exc:  # noqa: BLE001 -- counted by the test
            errors.put(f"{tag}: {type(exc).__name__}: {exc}")


def test_two_processes_writing_one_out_never_lose_the_report(tmp_path):
    out = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_write_reports, args=(str(out), tag, 12, errors)) for tag in "AB"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["writer"] in ("A", "B") and summary["round"] == 11
    assert {p.name for p in out.iterdir()} >= {"summary.json", "report.html", "steps.parquet"}
    assert [p.name for p in tmp_path.iterdir()] == ["shared"]  # no staging or old folders left


def test_default_report_folders_differ_within_one_second():
    from simrig.report.writer import default_out_dir

    names = {default_out_dir("fuzz") for _ in range(20)}
    assert len(names) == 20
