"""Bisection of a finding class over vLLM releases or commits: the search itself.

Each point gets one ``Verdict``: bad (the class, ``ClassKey``, shows), good, or skip
(it cannot be judged). A leg is an ordered list of points whose two ends differ:
``introduced`` (find the first bad point) or ``fixed`` (the first good one).
``search`` binary-searches one leg into a ``LegResult``.

See docs/bisect.md, 'From finding to fix'.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simrig.errors import UsageError

BAD, GOOD, SKIP = "bad", "good", "skip"
INTRODUCED, FIXED = "introduced", "fixed"
_PART = re.compile(r"^[A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class ClassKey:
    """A finding class as ``kind:stage:field[:exception_type]``."""

    kind: str
    stage: str
    field: str
    exception_type: str = ""

    @classmethod
    def parse(cls, text: str, flag: str = "--class") -> ClassKey:
        parts = text.strip().split(":")
        if len(parts) not in (3, 4) or not parts[0] or not parts[1] \
                or not all(_PART.match(p) for p in parts):
            raise UsageError(f"{flag} {text!r}: expected kind:stage:field[:exception_type], "
                             "e.g. dtype_drift:prepare:idx_mapping")
        return cls(*parts)

    @classmethod
    def from_header(cls, header: Any, path: str) -> ClassKey:
        """The class a trace declares: its one ``expect`` entry with a stage, else the
        shrinker's ``source.signature``; UsageError (naming the file) otherwise."""
        declared = [e for e in getattr(header, "expect", ()) or ()
                    if getattr(e, "kind", None) and getattr(e, "stage", None)]
        keys = {cls(e.kind, e.stage, e.field or "", e.exception_type or "") for e in declared}
        if len(keys) == 1:
            return keys.pop()
        if len(keys) > 1:
            names = ", ".join(sorted(k.text for k in keys))
            raise UsageError(f"{path}:1: expect: declares {len(keys)} classes ({names}); "
                             "pick one with --class")
        signature = (getattr(header, "source", None) or {}).get("signature")
        if isinstance(signature, list) and len(signature) >= 3 and signature[0] and signature[1]:
            return cls(*(str(s or "") for s in signature[:4]))
        raise UsageError(f"{path}:1: the header declares no finding class (no expect entry with "
                         "a stage, no source.signature); name one with --class kind:stage:field")

    @property
    def text(self) -> str:
        return ":".join([self.kind, self.stage, self.field]
                        + ([self.exception_type] if self.exception_type else []))

    def matches(self, row: dict[str, Any]) -> bool:
        """Whether a class-table row (classes.csv) is this class, whatever its verdict."""
        def value(key: str) -> str:
            v = row.get(key, "")
            return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)

        return (value("kind") == self.kind and value("stage") == self.stage
                and value("field") == self.field
                and (not self.exception_type or value("exception_type") == self.exception_type))


@dataclass
class Verdict:
    """One tested point."""

    verdict: str  # BAD | GOOD | SKIP
    reason: str = ""
    seconds: float = 0.0
    cached: bool = False
    detail: dict[str, Any] = field(default_factory=dict)


class EndpointError(UsageError):
    """An end of the range does not have the verdict its flag claims (exit 2)."""


@dataclass
class LegResult:
    direction: str  # INTRODUCED | FIXED
    labels: list[str]  # the points, oldest first
    lo: int  # the last point with the old verdict
    hi: int  # the first point with the new verdict
    ambiguous: list[int]  # skipped points between lo and hi
    tested: list[int]  # in test order

    @property
    def old_verdict(self) -> str:
        return GOOD if self.direction == INTRODUCED else BAD

    @property
    def new_verdict(self) -> str:
        return BAD if self.direction == INTRODUCED else GOOD

    @property
    def first_new(self) -> str:
        return self.labels[self.hi]

    @property
    def last_old(self) -> str:
        return self.labels[self.lo]

    @property
    def candidates(self) -> list[str]:
        """What the change may be: the first new point, or (ambiguous) any skipped one before it."""
        return [self.labels[i] for i in self.ambiguous] + [self.first_new]

    def sentence(self) -> str:
        first = "first bad" if self.direction == INTRODUCED else "first good"
        last = "last good" if self.direction == INTRODUCED else "last bad"
        if self.ambiguous:
            return (f"{self.direction} in one of {', '.join(self.candidates)} ({last} {self.last_old}; "
                    f"{len(self.ambiguous)} skipped point(s) in between could not be judged)")
        return f"{self.direction} in {self.first_new} ({first}; {last} {self.last_old})"


def search(labels: list[str], test: Callable[[int], Verdict], direction: str,
           end_flags: tuple[str, str] = ("old end", "new end")) -> LegResult:
    """Binary search of one leg. ``test(i)`` judges point i; ``end_flags`` name the two
    ends in errors (e.g. ``--good 0.30.0``).

    The two ends are tested first (an end with the wrong verdict, or one that cannot be
    judged, is an error: the range says nothing), then the middle of the open range; a
    skipped middle is replaced by the nearest untested point inside the range (the later
    one on a tie). When only skipped points are left between the last old and the first
    new point, the answer is ambiguous: the change is one of them or the first new point.
    """
    if len(labels) < 2:
        raise UsageError("bisect: the range needs two different points")
    old = GOOD if direction == INTRODUCED else BAD
    new = BAD if direction == INTRODUCED else GOOD
    tested: list[int] = []
    for index, flag, want in ((0, end_flags[0], old), (len(labels) - 1, end_flags[1], new)):
        got = test(index)
        tested.append(index)
        if got.verdict == SKIP:
            raise EndpointError(f"{flag}: cannot be judged ({got.reason})")
        if got.verdict != want:
            claim = "must not show" if want == GOOD else "must show"
            raise EndpointError(f"{flag}: {'shows' if got.verdict == BAD else 'does not show'} the "
                                f"class, but it {claim} it")
    lo, hi = 0, len(labels) - 1
    skipped: set[int] = set()
    while True:
        inner = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inner:
            break
        mid = (lo + hi) // 2
        index = min(inner, key=lambda j: (abs(j - mid), -j))
        got = test(index)
        tested.append(index)
        if got.verdict == SKIP:
            skipped.add(index)
        elif got.verdict == new:
            hi = index
        else:
            lo = index
    ambiguous = sorted(i for i in skipped if lo < i < hi)
    return LegResult(direction, list(labels), lo, hi, ambiguous, tested)
