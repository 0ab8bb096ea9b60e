"""Every argument vLLM's call sites hand on is a row: judged through the decisions, or not
judged with a reason whose cited lines still say so.

The installed release is read as text (never imported here); with ``SIMRIG_SIDE_VENV`` set,
the side venv's release is read too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.ledger import call_rows, call_sites
from simrig.ledger.call_rows import ROWS
from simrig.ledger.decisions import CALL_BEGIN, CALL_END, call_sites_table
from simrig.ledger.call_sites import CallSite, call_site_arguments, site_arguments
from simrig.ledger.decisions import decisions
from simrig.ledger.evidence import check_cite, vllm_version

from vllm_roots import installed_and_named_side

DECISIONS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "decisions.md"


@pytest.mark.parametrize("root", installed_and_named_side(), ids=str)
def test_every_call_site_argument_is_a_row(root):
    version = vllm_version(root)
    arguments, missing = call_site_arguments(root)
    assert [s.name for s in missing if version not in s.absent_in] == [], \
        f"vLLM {version}: call sites not found (renamed or moved?)"
    assert [s.name for s in call_sites.SITES if version in s.absent_in and s not in missing] == [], \
        f"vLLM {version}: listed as absent, but present"
    rowless = sorted(f"{a.site}: {a.key} = {a.text}" for a in arguments if a.row not in ROWS)
    assert rowless == [], f"vLLM {version}: arguments with no row in simrig/ledger/call_rows.py"


@pytest.mark.parametrize("root", installed_and_named_side(), ids=str)
def test_every_call_row_reason_still_holds(root):
    version = vllm_version(root)
    stale = [p for c in dict.fromkeys(call_rows.cites()) if (p := check_cite(c, root, version)) is not None]
    assert stale == [], f"vLLM {version}"


def test_every_row_is_judged_through_judged_decisions_or_has_a_reason():
    judged = {f"{d.stage}.{d.field}" for d in decisions() if d.judged}
    unknown = sorted(f"{site}: {key} -> {ref}" for (site, key), row in ROWS.items()
                     for ref in row.judged_by if ref not in judged)
    assert unknown == [], "judged through a decision that is not a judged row of docs/decisions.md"
    assert [k for k, row in ROWS.items() if not row.judged and not (row.reason and row.evidence)] == []
    assert {site for site, _ in ROWS} <= {s.name for s in call_sites.SITES}


def test_an_argument_without_a_row_is_named():
    source = ("class R:\n    def step(self, batch):\n        model_inputs = {'input_ids': batch.ids}\n"
              "        return self.sampler(batch.logits, batch, temperature=0.5)\n")
    sampler = CallSite("the sampler", "m.py", "R.step", "self.sampler")
    inputs = CallSite("the model's inputs", "m.py", "R.step", "{model_inputs}")
    assert [(a.key, a.text) for a in site_arguments(sampler, source)] == [
        ("batch.logits", "batch.logits"), ("batch", "batch"), ("temperature", "0.5")]
    assert [(a.key, a.text) for a in site_arguments(inputs, source)] == [("input_ids", "batch.ids")]
    assert site_arguments(CallSite("x", "m.py", "R.step", "self.model"), source) is None
    assert site_arguments(CallSite("x", "m.py", "R.gone", "self.sampler"), source) is None


def test_the_decisions_page_holds_the_generated_call_site_table():
    text = DECISIONS_PAGE.read_text(encoding="utf-8")
    section = text.split(CALL_BEGIN, 1)[1].split(CALL_END, 1)[0].strip("\n")
    assert section == call_sites_table(), "regenerate: python -m simrig.ledger.decisions"
