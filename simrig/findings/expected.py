"""Expected findings: what a trace header's ``expect`` declares.

    header.expect ──mark_expected(findings of each step)──► finding.extra["expected"] = True
                  └─missing_expectations(at the end)──────► a new ``expectation_missing``
                                                             finding per entry never matched

Used by the one replay loop (simrig.replay.run_steps), so replay, shrinking,
the self-test and the pytest plugin agree on what "expected" means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simrig.findings.findings import Finding

EXPECTATION_MISSING = "expectation_missing"  # finding kind: a declared class did not occur


def mark_expected(expect: Sequence[Any], found: list[Finding], met: set[int]) -> None:
    """Mark findings matching the header's ``expect`` as expected; note which matched."""
    if not expect:
        return
    for f in found:
        if f.known:
            continue
        for i, e in enumerate(expect):
            if e.matches(f):
                f.extra["expected"] = True
                f.extra["expectation"] = e.describe()
                met.add(i)


def missing_expectations(expect: Sequence[Any], met: set[int], last_index: int,
                         trace: str) -> list[Finding]:
    """A new finding per declared expectation that never occurred."""
    out = []
    for i, e in enumerate(expect):
        if i in met:
            continue
        out.append(Finding(kind=EXPECTATION_MISSING, step=e.step if e.step is not None else last_index,
                           stage=e.stage or "", check="expectations", req_ids=tuple(e.req_ids),
                           field=e.kind, expected=e.describe(), actual="not raised/reported",
                           message=f"expected {e.describe()} did not occur", trace=trace))
    return out
