"""Each path the rig does not drive cites lines that still say why, in every release at hand,
and docs/decisions.md carries the generated table."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.ledger.evidence import check_cite, vllm_version
from simrig.ledger.not_driven import BEGIN, END, NOT_DRIVEN, not_driven_table

from vllm_roots import installed_and_finished_sides, installed_vllm

RIG = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("root", installed_and_finished_sides(), ids=lambda p: vllm_version(p))
def test_every_not_driven_reason_still_holds(root):
    version = vllm_version(root)
    problems = [p for row in NOT_DRIVEN for c in row.evidence
                if (p := check_cite(c, root, version)) is not None]
    assert problems == []


def test_a_changed_line_is_caught():
    """The check can fail: a citation whose text no release has."""
    row = NOT_DRIVEN[0]
    bad = type(row.evidence[0])(row.evidence[0].file, row.evidence[0].function, "no such line here")
    root = installed_vllm()
    assert check_cite(bad, root, vllm_version(root)) is not None


def test_the_page_carries_the_generated_table():
    text = (RIG / "docs" / "decisions.md").read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    section = text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip()
    assert section == not_driven_table()
