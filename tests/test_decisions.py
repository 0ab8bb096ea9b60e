"""docs/decisions.md holds exactly the generated table of every decision, and every row
has a check or a reason with evidence."""

from __future__ import annotations

from pathlib import Path

from simrig.ledger.decisions import PATHS, decisions, decisions_table, page_section

PAGE = Path(__file__).resolve().parents[1] / "docs" / "decisions.md"


def test_the_page_holds_the_generated_table():
    assert page_section(PAGE.read_text(encoding="utf-8")) == decisions_table(), (
        "docs/decisions.md differs from simrig.ledger.decisions.decisions_table(): regenerate it")


def test_every_decision_is_judged_or_reasoned_with_evidence():
    bad = [(r.path, r.stage, r.field) for r in decisions()
           if not r.judged and not (r.reason and r.evidence)]
    assert bad == []


def test_every_path_has_rows_and_the_dummy_paths_judge_is_padding():
    rows = decisions()
    assert {r.path for r in rows} == {p.name for p in PATHS}
    padding = {r.path: r for r in rows if r.field == "is_padding"}
    for path in ("profile run", "idle DP dummy", "capture dummy", "real step", "PCP rank"):
        assert padding[path].judged, path
    assert "every token real" in padding["profile run"].check
