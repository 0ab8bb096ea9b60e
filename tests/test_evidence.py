"""Every reason a value is not judged cites a line of vLLM that still says so.

The installed release is read as text (located with ``importlib.util.find_spec``, never
imported here); with ``SIMRIG_SIDE_VENV`` set, the side venv's release is read too.
"""

from __future__ import annotations

import pytest

from simrig.ledger import evidence
from simrig.ledger.evidence import REASONS, RULES, Cite, block, check_cite, verify, vllm_version
from simrig.ledger.unchecked import UNCHECKED

from vllm_roots import installed_and_named_side


@pytest.mark.parametrize("root", installed_and_named_side(), ids=lambda p: str(p))
def test_every_cited_line_still_says_so(root):
    assert verify(root) == [], f"vLLM {vllm_version(root)} at {root}"


def test_every_unchecked_entry_cites_its_evidence():
    assert set(UNCHECKED) == set(REASONS)
    missing = [key for key, (_, cites) in REASONS.items() if not cites]
    assert missing == []


def test_a_stale_citation_is_named(tmp_path):
    pkg = tmp_path / "vllm"
    (pkg / "v1").mkdir(parents=True)
    (pkg / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    (pkg / "v1" / "m.py").write_text(
        "class A:\n    def f(\n        self,\n    ) -> None:\n        # the rule\n        x = 1\n\n"
        "    def g(self):\n        y = 2\n")
    assert check_cite(Cite("v1/m.py", "A.f", "# the rule"), pkg, "9.9.9") is None
    assert check_cite(Cite("v1/m.py", "A.f", "y = 2"), pkg, "9.9.9") is not None  # g's line, not f's
    assert check_cite(Cite("v1/m.py", "A.g", "x = 1", absent=True), pkg, "9.9.9") is None
    assert "no longer contains" in check_cite(Cite("v1/m.py", "A.f", "# gone"), pkg, "9.9.9")
    assert "no A.h" in check_cite(Cite("v1/m.py", "A.h", "x"), pkg, "9.9.9")
    # a release listed without the line must not have it
    assert check_cite(Cite("v1/m.py", "A.f", "# the rule", {"9.9.9": None}), pkg, "9.9.9") is not None
    assert check_cite(Cite("v1/m.py", "A.f", "# other", {"9.9.9": None}), pkg, "9.9.9") is None
    assert vllm_version(pkg) == "9.9.9"


def test_block_ends_at_the_next_definition():
    source = "def a():\n    one\n\ndef b():\n    two\n"
    assert block(source, "a") == "def a():\n    one\n"
    assert block(source, "c") is None


def test_the_dummy_rules_are_cited():
    assert {"profile_real", "idle_no_tokens", "capture_padding"} <= set(RULES)
    assert evidence.RULES["profile_real"].releases == {"0.30.0": None}  # 0.30 marks them padding
