"""Finding classes, verdicts, trace-header expectations and the time share (no vLLM)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simrig.findings.classes import (
    ClassTally,
    Where,
    classes_from_rows,
    verdict_counts,
    verdict_line,
    verdict_of,
)
from simrig.findings.expected import EXPECTATION_MISSING, mark_expected, missing_expectations
from simrig.findings.findings import Finding
from simrig.report.timing import time_share
from simrig.trace_io.trace import Expectation, TraceError, TraceReader


def _f(kind="key_error", step=0, stage="gather", fld="", exc="KeyError", ids=("ghost",), **kw):
    return Finding(kind=kind, step=step, stage=stage, check="runner", field=fld,
                   exception_type=exc, req_ids=tuple(ids), **kw)


def test_verdicts():
    assert verdict_of(_f()) == "new"
    assert verdict_of(_f(known=True)) == "known"
    loud = _f()
    loud.extra["loud_rejection"] = True
    assert verdict_of(loud) == "expected"
    declared = _f(kind="rig_error")  # any kind, also ones added later
    declared.extra["expected"] = True
    assert verdict_of(declared) == "expected"


def test_one_row_per_class_with_first_last_and_shortest_reproducer():
    tally = ClassTally()
    for trace, step in (("long.jsonl", 3), ("long.jsonl", 9), ("short.jsonl", 1)):
        tally.add(_f(step=step, ids=("a", "b")), Where(trace, 2, replay_args=("--pcp-sizes", "2")))
    tally.add(_f(kind="dtype_drift", stage="dummy", fld="logits_indices", exc="", known=True),
              Where("long.jsonl"))
    tally.choose_reproducers({"long.jsonl": 400, "short.jsonl": 3})
    frame = tally.frame()
    assert list(frame["verdict"]) == ["new", "known"]  # new first
    row = frame.iloc[0]
    assert row["occurrences"] == 3 and row["traces"] == 2
    assert (row["first_trace"], row["first_step"], row["last_trace"], row["last_step"]) == \
        ("long.jsonl", 3, "short.jsonl", 1)
    assert row["req_ids"] == "a,b" and row["first_pcp_size"] == 2
    assert row["reproduce"] == "simrig replay short.jsonl --pcp-sizes 2"
    assert verdict_counts(frame) == {"classes": 2, "new": 1, "known": 1, "expected": 0}
    assert verdict_line(verdict_counts(frame)) == "1 new finding class (1 known, 0 expected)"
    assert verdict_line({"new": 0, "known": 2, "expected": 3}).startswith("no new finding classes")


def test_known_classes_carry_their_explanation():
    tally = ClassTally()
    tally.add(_f(kind="dtype_drift", stage="dummy", fld="logits_indices", exc="", known=True),
              Where("t"))

    class Entry:
        explanation, evidence = "int32 in make_dummy", "input_batch.py"

    tally.explain(lambda kind, stage, fld, check: Entry() if fld == "logits_indices" else None)
    row = tally.frame().iloc[0]
    assert (row["explanation"], row["evidence"]) == ("int32 in make_dummy", "input_batch.py")


def test_classes_from_rows_groups_occurrence_rows():
    rows = pd.DataFrame([{**_f(step=s).row(), "trace": "t", "pcp_size": 1, "verdict": "new"}
                         for s in range(5)]
                        + [{**_f(kind="x", exc="").row(), "trace": "t", "pcp_size": 1,
                            "verdict": "expected"}])
    frame = classes_from_rows(rows)
    assert len(frame) == 2 and list(frame["occurrences"]) == [5, 1]
    assert list(frame["verdict"]) == ["new", "expected"]


def _header(tmp_path, expect) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"format": "simrig-trace", "version": 1, "adversarial": True,
                                "expect": expect}) + "\n{}\n")
    return str(path)


def test_expectations_parse_and_match(tmp_path):
    reader = TraceReader(_header(tmp_path, [{"kind": "key_error", "stage": "lifecycle", "step": 1,
                                             "req_ids": ["ghost1"], "exception_type": "KeyError"}]))
    (e,) = reader.header.expect
    reader.close()
    assert e.describe() == "key_error at step 1 lifecycle naming ghost1 (KeyError)"
    assert e.matches(_f(step=1, stage="lifecycle", ids=("ghost1", "r0")))
    assert not e.matches(_f(step=2, stage="lifecycle", ids=("ghost1",)))
    assert not e.matches(_f(step=1, stage="gather", ids=("ghost1",)))
    assert not e.matches(_f(step=1, stage="lifecycle", ids=("other",)))
    assert Expectation("key_error").to_json() == {"kind": "key_error"}


@pytest.mark.parametrize("expect, message", [
    ({"kind": "x"}, "t.jsonl:1: expect: must be a list"),
    ([{"stage": "gather"}], "t.jsonl:1: expect[0].kind: must be a non-empty string"),
    ([{"kind": "x", "stpe": 1}], "t.jsonl:1: expect[0].stpe: unknown field"),
    ([{"kind": "x", "step": -1}], "t.jsonl:1: expect[0].step: must be >= 0"),
    ([{"kind": "x", "req_ids": "ghost"}], "t.jsonl:1: expect[0].req_ids: must be a list"),
])
def test_bad_expectations_name_file_line_field(tmp_path, expect, message):
    with pytest.raises(TraceError) as info:
        TraceReader(_header(tmp_path, expect))
    assert message in str(info.value)


def test_expected_finding_is_marked_and_a_missing_one_becomes_new():
    expect = (Expectation("key_error", stage="gather", step=0),
              Expectation("key_error", stage="lifecycle", step=1, req_ids=("ghost1",)))
    met: set[int] = set()
    found = [_f(step=0), _f(kind="dtype_drift", exc="")]
    mark_expected(expect, found, met)
    assert [verdict_of(f) for f in found] == ["expected", "new"] and met == {0}
    (missing,) = missing_expectations(expect, met, last_index=4, trace="t.jsonl")
    assert missing.kind == EXPECTATION_MISSING and verdict_of(missing) == "new"
    assert missing.step == 1 and missing.req_ids == ("ghost1",)
    assert "key_error at step 1 lifecycle naming ghost1 did not occur" in missing.message


def test_time_share_splits_vllm_calls_from_the_rig():
    steps = pd.DataFrame({"stage": ["lifecycle", "gather", "prepare", "prepare"],
                          "duration_ms": [100.0, 100.0, 300.0, 500.0]})
    share = time_share(steps, wall_s=2.0)
    assert share["vllm_s"] == 1.0 and share["rig_s"] == 1.0 and share["vllm_share"] == 0.5
    assert share["stages"]["prepare"] == {"s": 0.8, "share": 0.4}
    assert list(share["stages"]) == ["lifecycle", "gather", "prepare"]  # execution order
    assert time_share(steps, wall_s=0.5)["rig_s"] == 0.0  # wall never below what it contains


def test_selftest_scoreboard_in_the_class_vocabulary():
    from simrig.selftest.mutant_runs import ChildResult, scoreboard_classes, scoreboard_rows

    rows = scoreboard_rows([
        ChildResult("baseline"),
        ChildResult("getitem-to-get", detected=True, via="replay:x.jsonl", kind="expectation_missing",
                    signature=["expectation_missing", "gather", "key_error", ""],
                    shrunk_trace="traces/regressions/x.jsonl", seconds_to_detection=3.2),
        ChildResult("slot-order-fifo"), ChildResult("pcp-wrong-chunk")])
    frame = scoreboard_classes(rows).set_index("verdict")
    assert sorted(frame.index) == ["expected", "known", "new"]  # the clean baseline is no class
    assert frame.loc["new", "signature"] == "pcp-wrong-chunk SURVIVED"  # a survivor fails
    assert frame.loc["known", "signature"] == "slot-order-fifo equivalent"
    assert frame.loc["expected", "reproduce"] == "simrig replay traces/regressions/x.jsonl"


def test_expected_classes_say_why():
    tally = ClassTally()
    declared, loud = _f(), _f(stage="lifecycle")
    declared.extra.update(expected=True, expectation="key_error at step 0 gather")
    loud.extra.update(loud_rejection=True, violation="unknown_cached")
    tally.add(declared, Where("t"))
    tally.add(loud, Where("t"))
    why = set(tally.frame()["explanation"])
    assert why == {"expected: the trace header declares key_error at step 0 gather",
                   "expected: the runner loudly rejected a contract violation (unknown_cached) "
                   "sent on purpose"}
