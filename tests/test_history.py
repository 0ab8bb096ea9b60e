"""The history store and ``simrig history`` on hand-made rows (no vLLM)."""

from __future__ import annotations

import json
import os

import pandas as pd

from simrig.cli import main
from simrig.history.page import history_summary, per_release, render_history
from simrig.history.store import append_run, class_timeline, load_history, run_trends


def _classes(*signatures, verdict="new"):
    return pd.DataFrame([{"signature": s, "kind": s.split(" · ")[0], "stage": "gather", "field": "",
                          "exception_type": "", "verdict": verdict, "occurrences": 2}
                         for s in signatures])


def _run(store, day, suite, classes, version="0.33.0", **extra):
    summary = {"command": suite.split()[0], "suite": suite, "created_utc": f"2026-11-{day:02d}T03:00:00+00:00",
               "vllm_version": version, "exit_status": int((classes["verdict"] == "new").any())
               if len(classes) else 0}
    summary.update(extra)
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
    assert c["fixed_since"] == "" and c["not_seen_since"] == ""  # the only fuzz run still shows it
    assert a["not_seen_since"] == "" and b["not_seen_since"] == ""  # replays: fixed, not "not seen"
    trends = run_trends(runs, classes)
    assert list(trends["fixed"]) == [0, 0, 1, 1] and list(trends["new"]) == [2, 1, 1, 0]
    assert list(trends["not_seen"]) == [0, 0, 0, 0]


def test_a_fuzz_run_without_a_class_has_not_seen_it_not_fixed_it(tmp_path):
    store = tmp_path / "history"
    ids = [_run(store, 1, "fuzz valid", _classes("value_mismatch · c", "key_error · d")),
           _run(store, 2, "fuzz valid", _classes("key_error · d")),
           _run(store, 3, "selftest", _classes("survivor · m")),
           _run(store, 4, "selftest", _classes())]
    runs, classes = load_history(store)
    line = class_timeline(runs, classes).set_index("signature")
    c, d, m = line.loc["value_mismatch · c"], line.loc["key_error · d"], line.loc["survivor · m"]
    assert (c["fixed_since"], c["not_seen_since_run"]) == ("", ids[1])
    assert c["not_seen_since"].startswith("2026-11-02")
    assert (d["fixed_since"], d["not_seen_since"]) == ("", "")  # still showing
    assert (m["fixed_since"], m["not_seen_since_run"]) == ("", ids[3])
    trends = run_trends(runs, classes)
    assert list(trends["fixed"]) == [0, 0, 0, 0] and list(trends["not_seen"]) == [0, 1, 0, 1]
    summary = history_summary(runs, classes)
    assert summary["fixed"] == []
    assert {(i["signature"], i["not_seen_since_run"]) for i in summary["not_seen"]} == \
        {("value_mismatch · c", ids[1]), ("survivor · m", ids[3])}


def test_only_a_replay_of_as_much_proves_a_fix(tmp_path):
    """Same suite string, but the later replay ran fewer stages, fewer PCP sizes, crashed
    (exit 3) or was cut: the class is only not seen; the first full replay fixes it."""
    store = tmp_path / "history"
    full = {"stages": ["gather", "prepare", "dummy"], "pcp_sizes": [1, 2]}
    ids = [_run(store, 1, "replay traces/samples", _classes("key_error · a"), **full),
           _run(store, 2, "replay traces/samples", _classes(), stages=["gather"], pcp_sizes=[1, 2]),
           _run(store, 3, "replay traces/samples", _classes(), stages=full["stages"], pcp_sizes=[1]),
           _run(store, 4, "replay traces/samples", _classes(), exit_status=3, **full),
           _run(store, 5, "replay traces/samples", _classes(), stopped_by="signal", **full),
           _run(store, 6, "replay traces/samples", _classes(), **full)]
    runs, classes = load_history(store)
    a = class_timeline(runs, classes).set_index("signature").loc["key_error · a"]
    assert (a["fixed_since_run"], a["not_seen_since"]) == (ids[5], "")
    trends = run_trends(runs, classes)
    assert list(trends["not_seen"]) == [0, 1, 0, 0, 0, 0] and list(trends["fixed"]) == [0] * 6
    # without the last full replay it is "not seen since" the first later run
    runs5 = runs[runs["run_id"] != ids[5]]
    a = class_timeline(runs5, classes).set_index("signature").loc["key_error · a"]
    assert (a["fixed_since"], a["not_seen_since_run"]) == ("", ids[1])


def test_since_filters_runs_and_a_torn_write_is_ignored(tmp_path):
    store, ids = _store(tmp_path)
    runs, classes = load_history(store, since="2026-11-03")
    assert list(runs["run_id"]) == ids[2:] and set(classes["run_id"]) == {ids[2]}
    # classes written, run row missing (interrupted append): not part of the history
    orphan = pd.read_parquet(store / "classes" / f"{ids[0]}.parquet").assign(run_id="orphan")
    orphan.to_parquet(store / "classes" / "orphan.parquet", index=False)
    pd.read_parquet(store / "classes")  # the folder still reads as one dataset
    assert len(load_history(store)[1]) == 4


def test_history_command_writes_a_page_with_every_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SIMRIG_ACROSS_RELEASES", raising=False)
    store, ids = _store(tmp_path)
    assert main(["history", "--store", str(store), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["runs"] == 4 and summary["across_releases"] is False
    # a replay on 0.34.0 fixes nothing it never showed on 0.34.0: b was seen on 0.33.0 only
    assert [(f["suite"], f["signature"], f["fixed_since_run"]) for f in summary["fixed"]] == \
        [("replay traces/ on vLLM 0.34.0", "key_error · a", ids[3])]
    on_33 = "replay traces/ on vLLM 0.33.0"
    assert {(n["suite"], n["signature"]) for n in summary["still_new"]} == {
        (on_33, "key_error · a"), (on_33, "dtype_drift · b"), ("fuzz valid on vLLM 0.33.0", "value_mismatch · c")}
    page = (store / "history.html").read_text()
    assert "4 run(s) of 2 suite(s) on 2 vLLM release(s)" in page and all(i in page for i in ids)
    assert "<img" in page and f"fixed since 2026-11-04 03:00 ({ids[3]})" in page
    assert "previous run of its suite on the same vLLM release" in page
    assert "not seen since" not in page.split("<h2>Finding classes</h2>")[1].split("</p>", 1)[1]
    # across releases, asked for: the 0.34.0 replay of the 3rd is the next run after b's last one
    assert main(["history", "--store", str(store), "--json", "--across-releases"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["across_releases"] is True
    assert {(f["suite"], f["signature"], f["fixed_since_run"]) for f in summary["fixed"]} == \
        {("replay traces/", "key_error · a", ids[3]), ("replay traces/", "dtype_drift · b", ids[2])}
    assert "previous run of its suite on any vLLM release" in (store / "history.html").read_text()
    assert "SIMRIG_ACROSS_RELEASES" not in os.environ  # asked for one command only


def test_a_nightly_alternating_releases_compares_each_run_on_its_own_release(tmp_path):
    """0.33.0 and 0.31.0 on alternate nights: each night's trend row is against the previous
    night of its release, not against yesterday's other release."""
    store = tmp_path / "history"
    for day, version, found in ((1, "0.33.0", ("k · a",)), (2, "0.31.0", ("k · a", "d · b", "d · c")),
                                (3, "0.33.0", ("k · a",)), (4, "0.31.0", ("k · a", "d · b", "d · c"))):
        _run(store, day, "fuzz valid", _classes(*found), version=version, examples_per_s=1.0 + day)
    runs, classes = load_history(store)
    trends = run_trends(per_release(runs), per_release(classes))
    assert list(trends["suite"]) == ["fuzz valid on vLLM 0.33.0", "fuzz valid on vLLM 0.31.0"] * 2
    assert list(trends["not_seen"]) == [0, 0, 0, 0]  # across releases it would be [0, 0, 2, 0]
    assert list(run_trends(runs, classes)["not_seen"]) == [0, 0, 2, 0]
    page = render_history(runs, classes, any_release=False)
    assert "fuzz valid on vLLM 0.31.0" in page and "fuzz valid on vLLM 0.33.0" in page


def test_history_usage_errors(tmp_path, capsys):
    assert main(["history", "--store", str(tmp_path / "none-here")]) == 2
    assert main(["history", "--store", str(tmp_path), "--since", "yesterday"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "holds no history" in err[0] and "--since" in err[1]
