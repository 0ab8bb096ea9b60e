"""Known findings carry the range of releases they apply to (no vLLM needed)."""

from __future__ import annotations

import json

import pytest

from simrig.errors import UsageError
from simrig.findings import findings as fk
from simrig.findings.known import in_range, load_known_findings, parse_known_findings, release_tuple

SUPPORTED = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")


@pytest.mark.parametrize("version, spec, inside", [
    ("0.32.0", ">=0.30.0,<=0.33.0", True),
    ("0.30.0", ">=0.30,<=0.33", True),
    ("0.29.9", ">=0.30.0", False),
    ("0.34.0", ">=0.30.0,<=0.33.0", False),
    ("0.34.0.dev12+gabcdef", "<0.35", True),  # a source checkout of main
    ("0.33.0", "==0.33.0", True),
    ("0.33.1", "==0.33.0", False),
    ("0.31.0", ">0.31.0", False),
])
def test_release_ranges(version, spec, inside):
    assert in_range(version, spec) is inside


def test_release_tuple_ignores_local_and_dev_parts():
    assert release_tuple("0.34.0.dev12+g1a2b") == (0, 34, 0)
    assert release_tuple("1.0") == (1, 0, 0)


def _doc(**entry):
    base = {"kind": fk.DTYPE_DRIFT, "stage": "dummy", "field": "logits_indices", "check": "parity",
            "explanation": "why", "evidence": "file, function"}
    return json.dumps({"vllm_version": "0.33.0", "findings": [{**base, **entry}]})


def test_a_ranged_entry_explains_the_finding_on_every_release_in_range():
    table = parse_known_findings(_doc(vllm=">=0.31.0,<=0.32.0"), "/x/known-findings-test.json")
    finding = lambda: fk.Finding(kind=fk.DTYPE_DRIFT, step=3, stage="dummy", check="parity",
                                 field="logits_indices")
    for version, known in (("0.30.0", False), ("0.31.0", True), ("0.32.0", True), ("0.33.0", False)):
        f = table.for_version(version).apply([finding()])[0]
        assert f.known is known, version
        assert f.known_by == ("known-findings-test.json#0" if known else "")


def test_an_entry_without_a_range_applies_to_its_file_release_only():
    table = parse_known_findings(_doc(), "k.json")
    assert len(table.for_version("0.33.0")) == 1
    assert len(table.for_version("0.32.0")) == 0


@pytest.mark.parametrize("bad", ["0.30", ">=0.30,<=x", ">= 0.30 ; <0.33"])
def test_a_bad_range_names_the_entry_and_field(bad):
    with pytest.raises(UsageError, match=r"k\.json:1: findings\[0\]\.vllm"):
        parse_known_findings(_doc(vllm=bad), "k.json")


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_logits_indices_discrepancy_is_known_on_every_supported_release(version):
    known = load_known_findings(version)
    for stage, check in (("dummy", "parity"), ("dummy", "contract"), ("partition", "contract")):
        f = fk.Finding(kind=fk.DTYPE_DRIFT, step=0, stage=stage, check=check, field="logits_indices",
                       expected="torch int64", actual="torch int32")
        assert known.apply([f])[0].known_by.startswith("known-findings"), (version, stage, check)
        other = fk.Finding(kind=fk.DTYPE_DRIFT, step=0, stage=stage, check=check, field="logits_indices",
                           expected="torch int64", actual="torch int16")
        assert not known.apply([other])[0].known, (version, stage, check)  # another dtype is new
    assert len(load_known_findings("0.29.0")) == 0  # no MRV2 before 0.30.0
