"""Honest selftest scoring: what counts as a detection, and how a survivor is reported."""

from __future__ import annotations

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.selftest.catalogue import BY_NAME, CATALOGUE
from simrig.selftest.mutant_runs import ChildResult, counts_as_detection, scoreboard_rows


def finding(**kw) -> Finding:
    base = dict(kind=fk.VALUE_MISMATCH, step=0, stage="prepare", check="reference", field="positions")
    base.update(kw)
    return Finding(**base)


def test_only_findings_the_unmutated_code_cannot_produce_count():
    assert counts_as_detection(finding(), set())
    assert not counts_as_detection(finding(known=True), set())
    assert not counts_as_detection(finding(kind=fk.KEY_ERROR, extra={"loud_rejection": True}), set())
    assert not counts_as_detection(finding(kind=fk.RIG_ERROR), set())
    assert not counts_as_detection(finding(), {(fk.VALUE_MISMATCH, "prepare", "positions", "")})


def test_a_survivor_is_reported_as_one():
    results = [ChildResult("baseline"),
               ChildResult("sort-key-prefill-first", detected=False),
               ChildResult("query-start-loc-off-by-one", detected=True, phase="fuzz-valid"),
               ChildResult("slot-order-fifo", detected=False),
               ChildResult("control-noop", detected=False)]
    status = {r["mutant"]: r["status"] for r in scoreboard_rows(results)}
    assert status == {"baseline": "clean", "sort-key-prefill-first": "SURVIVED",
                      "query-start-loc-off-by-one": "detected", "slot-order-fifo": "equivalent",
                      "control-noop": "control survived"}
    detected_control = scoreboard_rows([ChildResult("control-noop", detected=True)])
    assert detected_control[0]["status"] == "CONTROL DETECTED"


def test_the_catalogue_has_one_control_that_changes_no_statement():
    controls = [m for m in CATALOGUE if m.control]
    assert [m.name for m in controls] == ["control-noop"]
    m = BY_NAME["control-noop"]
    assert m.new.split("#")[0].strip() == m.old.strip()
