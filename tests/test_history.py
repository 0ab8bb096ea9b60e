"""The history store and ``simrig history`` on hand-made rows (no vLLM)."""

from __future__ import annotations

import json

import pandas as pd

from simrig.cli import main
from simrig.report.history import append_run, class_timeline, load_history, run_trends


def _classes(*signatures, verdict="new"):
    return pd.DataFrame([{"signature": s, "kind": s.split(" · ")[0], "stage": "gather", "field": "",
                          "exception_type": "", "verdict": verdict, "occurrences": 2}
                         for s in signatures])


def _run(store, day, suite, classes, version="0.33.0", **extra):
    summary = {"command": suite.split()[0], "suite": suite, "created_utc": f"2026-11-{day:02d}T03:00:00+00:00",
               "vllm_version": version, "exit_status": int((classes["verdict"] == "new").any())
               if len(classes) else 0, **extra}
    return append_run(store, summary, classes)


def _store(tmp_path):
    store = tmp_path / "history"
    ids = [_run(store, 1, "replay traces/", _classes("key_error · a", "dtype_drift · b"), steps_per_s=40.0),
           _run(store, 2, "fuzz valid", _classes("value_mismatch · c"), examples_per_s=1.5),
           _run(store, 3, "replay traces/", _classes("key_error · a"), version="0.34.0", steps_per_s=44.0),
           _run(store, 4, "replay traces/", _classes(), version="0.34.0", steps_per_s=45.0)]
    return store, ids


def test_first_seen_last_seen_and_fixed_since(tmp_path):
    store, ids = _store(tmp_path)
    runs, classes = load_history(store)
    assert list(runs["run_id"]) == ids and len(classes) == 4
    line = class_timeline(runs, classes).set_index("signature")
    a, b, c = line.loc["key_error · a"], line.loc["dtype_drift · b"], line.loc["value_mismatch · c"]
    assert a["first_seen"].startswith("2026-11-01") and a["last_seen"].startswith("2026-11-03")
    assert a["vllm_versions"] == "0.33.0,0.34.0" and a["runs_seen"] == 2
    assert a["fixed_since_run"] == ids[3] and a["fixed_since"].startswith("2026-11-04")
    # b vanished on the 3rd: the next run of the *same suite*, not the fuzz run of the 2nd
    assert b["fixed_since_run"] == ids[2] and b["last_run"] == ids[0]
    assert c["fixed_since"] == ""  # the only fuzz run still shows it
    trends = run_trends(runs, classes)
    assert list(trends["fixed"]) == [0, 0, 1, 1] and list(trends["new"]) == [2, 1, 1, 0]


def test_since_filters_runs_and_a_torn_write_is_ignored(tmp_path):
    store, ids = _store(tmp_path)
    runs, classes = load_history(store, since="2026-11-03")
    assert list(runs["run_id"]) == ids[2:] and set(classes["run_id"]) == {ids[2]}
    # classes written, run row missing (interrupted append): not part of the history
    orphan = pd.read_parquet(store / "classes" / f"{ids[0]}.parquet").assign(run_id="orphan")
    orphan.to_parquet(store / "classes" / "orphan.parquet", index=False)
    pd.read_parquet(store / "classes")  # the folder still reads as one dataset
    assert len(load_history(store)[1]) == 4


def test_history_command_writes_a_page_with_every_run(tmp_path, capsys):
    store, ids = _store(tmp_path)
    assert main(["history", "--store", str(store), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["runs"] == 4
    assert {(f["signature"], f["fixed_since_run"]) for f in summary["fixed"]} == \
        {("key_error · a", ids[3]), ("dtype_drift · b", ids[2])}
    page = (store / "history.html").read_text()
    assert "4 run(s) of 2 suite(s)" in page and all(i in page for i in ids)
    assert "<img" in page and "fixed_since" in page


def test_history_usage_errors(tmp_path, capsys):
    assert main(["history", "--store", str(tmp_path / "none-here")]) == 2
    assert main(["history", "--store", str(tmp_path), "--since", "yesterday"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "holds no history" in err[0] and "--since" in err[1]
