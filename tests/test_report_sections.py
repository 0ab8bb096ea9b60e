"""The report page's order and parts, the changes since the previous run, --summary-md.

Class tables here are written by hand (no vLLM): they stand for what a run hands the page.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from simrig.findings.classes import CLASS_COLUMNS
from simrig.history.changes import since_previous
from simrig.history.store import append_run
from simrig.report.writer import write_report
from simrig.views.changes_text import change_lines
from simrig.views.sections import Links, entry_anchor
from simrig.views.summary_md import summary_markdown

ROOT = Path(__file__).resolve().parents[1]
EXPLANATION = "InputBatch.make_dummy builds logits_indices as query_start_loc[1:] - 1 on an int32 tensor"


def _class(signature: str, verdict: str, **extra) -> dict:
    kind, stage, fld = signature.split(" · ")[:3]
    row = {c: "" for c in CLASS_COLUMNS}
    row.update(signature=signature, verdict=verdict, occurrences=3, consequences=0, kind=kind,
               stage=stage, field=fld, checks="parity", traces=1, first_trace="t.jsonl",
               first_pcp_size=1, first_step=0, first_rank=-1, first_elapsed_s=float("nan"),
               first_example=-1, last_trace="t.jsonl", last_pcp_size=1, last_step=2, last_rank=-1,
               message=f"{signature} went wrong", **extra)
    return row


def _classes() -> pd.DataFrame:
    return pd.DataFrame([
        _class("dtype_drift · prepare · idx_mapping", "new", reproduce="simrig replay t.jsonl",
               repro_pytest="simrig repro t.jsonl --class dtype_drift:prepare:idx_mapping --pytest x.py"),
        _class("dtype_drift · dummy · logits_indices", "known", explanation=EXPLANATION,
               known_by="known-findings.json#0"),
        _class("key_error · gather · unknown_scheduled_id", "expected",
               explanation="expected: the trace header declares it")], columns=list(CLASS_COLUMNS))


def test_the_page_reads_verdict_new_changes_plots_then_folded_known(tmp_path):
    classes = _classes()
    summary = {"command": "replay", "suite": "replay t", "exit_status": 1,
               "since_previous": {"status": "first", "suite": "replay t"}}
    empty = pd.DataFrame()
    out = write_report(tmp_path / "rep", empty, empty, empty, summary, classes=classes,
                       occurrences=empty, headline="replayed 3 steps")
    page = (out / "report.html").read_text()
    order = [page.index(mark) for mark in ("class='banner bad'", "<section id='new-classes'>",
                                           "<section id='changes'>", "<section id='known-classes'>")]
    assert order == sorted(order)
    assert page.index("simrig replay t.jsonl") < page.index("<section id='changes'>")
    known = page[page.index("<section id='known-classes'>"):]
    assert known.index("<details>") < known.index("logits_indices")  # collapsed, one line each
    assert EXPLANATION not in page.split("<h2>Full summary</h2>")[0]  # one click away, never inline
    assert "known-findings.json#0" in known and f"known-findings.md#{entry_anchor('known-findings.json#0')}" in known
    assert "reports/upstream/dummy-logits-indices-int32" in known  # its folder lists entry #0


def test_a_known_entry_links_to_the_upstream_folder_written_for_it():
    links = Links(page_dir=ROOT / "reports" / "x")
    folder = links.upstream("known-findings.json#13", "dtype_drift", "capture", "logits_indices")
    assert folder == ("dummy-logits-indices-int32", "../upstream/dummy-logits-indices-int32/ISSUE.md")
    assert links.upstream("known-findings.json#2", "dtype_drift", "partition", "logits_indices") is None
    assert links.docs("known-findings.json#13").endswith("known-findings-json-13")


def test_changes_since_the_previous_run_of_the_same_suite(tmp_path):
    store = tmp_path / "history"
    before = _classes().iloc[1:]  # the known and expected classes only
    assert since_previous({"suite": "replay t"}, before, store)["status"] == "first"
    append_run(store, {"command": "replay", "suite": "replay t", "steps_per_s": 10.0,
                       "created_utc": "2026-12-01T00:00:00+00:00"}, before)
    append_run(store, {"command": "fuzz", "suite": "fuzz valid", "created_utc": "2026-12-02T00:00:00+00:00"},
               _classes())
    now = _classes().iloc[[0, 2]]  # the new class appears, the known one is gone
    changes = since_previous({"command": "replay", "suite": "replay t", "steps_per_s": 5.0}, now, store)
    assert changes["status"] == "compared" and changes["previous_created_utc"].startswith("2026-12-01")
    assert changes["appeared"] == [{"signature": "dtype_drift · prepare · idx_mapping", "verdict": "new"}]
    assert changes["gone"] == [{"signature": "dtype_drift · dummy · logits_indices", "verdict": "known",
                                "why": "fixed"}]  # a replay with no narrower stages or sizes: fixed
    lines = change_lines(changes)
    assert lines[0] == "1 class(es) new since then, 1 of them failing"
    assert any("steps/s down 10 -> 5 (-50%)" in line for line in lines)
    assert since_previous({"suite": "replay t"}, now, tmp_path / "missing")["status"] == "first"


def test_summary_markdown_opens_with_a_status_line_then_reproducers_and_changes():
    classes = _classes()
    changes = {"status": "compared", "suite": "replay t", "previous_created_utc": "2026-12-01T00:00:00",
               "vllm": "0.33.0", "previous_vllm": "0.33.0", "previous_exit_status": 0, "appeared_count": 1,
               "gone_count": 0, "appeared": [{"signature": "dtype_drift · prepare · idx_mapping",
                                              "verdict": "new"}], "gone": [], "verdict_changed": [],
               "metrics": []}
    text = summary_markdown("replay", "1 new finding class (1 known, 1 expected) — exit 1", "facts",
                            {"since_previous": changes}, classes, "out/report.html")
    lines = text.splitlines()
    assert lines[0] == "### simrig replay: 1 new finding class (1 known, 1 expected) — exit 1"
    assert "  - reproduce: `simrig replay t.jsonl`" in lines
    assert "  - pytest file for vLLM: `simrig repro t.jsonl --class dtype_drift:prepare:idx_mapping " \
           "--pytest x.py`" in lines
    assert "**Since the previous run** (previous run of replay t on vLLM 0.33.0: 2026-12-01 00:00 UTC " \
           "(exit 0))" in lines
    assert EXPLANATION not in text and lines[-1] == "Report: `out/report.html`"
    json.dumps(changes)  # summary.json carries it as is


def test_an_unwritable_summary_md_is_one_line_and_exit_2_before_the_run(tmp_path, capsys):
    from simrig import cli

    trace = ROOT / "traces" / "samples" / "chunked_prefill.jsonl"
    for command in (["replay", str(trace)], ["fuzz", "--max-examples", "1"], ["selftest"]):
        status = cli.main([*command, "--out", str(tmp_path / "out"), "--summary-md", str(tmp_path)])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and "--summary-md" in err[0] and "is a directory" in err[0], err
        assert not (tmp_path / "out").exists()
