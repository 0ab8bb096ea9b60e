"""Comparing one stage's observed fields with predicted values, and rendering values in findings."""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.observe import StageObs

MAX_SHOWN = 12


def short(values: Any, limit: int = MAX_SHOWN, at: int = 0) -> str:
    """A finding-friendly rendering of a value; long arrays show ``limit``
    items from index ``at`` (the first difference), e.g. ``[40:52] [...] (64 in all)``."""
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, (list, tuple)):
        items = list(values)
        if len(items) <= limit:
            return "[" + ", ".join(str(v) for v in items) + "]"
        start = max(0, min(at - limit // 4, len(items) - limit))
        body = ", ".join(str(v) for v in items[start:start + limit])
        return f"[{start}:{start + limit}] [{body}] ({len(items)} in all)"
    return str(values)


class Comparer:
    """Compares observed fields of one stage with predictions, appending findings."""

    def __init__(self, index: int, stage: StageObs, out: list[Finding],
                 skip: frozenset[str] = frozenset()):
        self.index, self.stage, self.out = index, stage, out
        self.skip = skip  # request ids whose rows are not judged

    def _add(self, name: str, ids: tuple[str, ...], expected: Any, actual: Any, msg: str,
             at: int = 0) -> None:
        self.out.append(Finding(kind=fk.VALUE_MISMATCH, step=self.index, stage=self.stage.stage,
                                check="reference", req_ids=ids, field=name,
                                expected=short(expected, at=at), actual=short(actual, at=at), message=msg))

    def _present(self, name: str, kinds: tuple[str, ...], expected: Any) -> Any:
        """The field's observation, or None after a missing_field finding: a
        field the model predicts is never skipped for being absent or None."""
        obs = self.stage.fields.get(name)
        if obs is not None and obs.kind in kinds:
            return obs
        declared = self.stage.declared
        if obs is None and declared is not None and name.split(".")[0] not in declared:
            return None  # this release's type has no such field: a release difference
        what = "missing" if obs is None else f"{obs.kind} {obs.dtype}".strip()
        self.out.append(Finding(kind=fk.MISSING_FIELD, step=self.index, stage=self.stage.stage,
                                check="reference", field=name, expected=short(expected),
                                actual=what, message=f"{name} is {what}; the model predicts a value"))
        return None

    def list_(self, name: str, expected: list[str]) -> None:
        obs = self._present(name, ("list",), expected)
        if obs is not None and list(obs.values or []) != expected:
            self._add(name, tuple(expected), expected, obs.values, "batch order differs")

    def scalar(self, name: str, expected: Any) -> None:
        obs = self._present(name, ("scalar",), expected)
        if obs is not None and obs.values != expected:
            self._add(name, (), expected, obs.values, f"expected {expected}, got {obs.values}")

    def array(self, name: str, expected: np.ndarray, row_ids: list[str], *, padded_to: int | None = None,
              tail_range: tuple[int, int] | None = None) -> None:
        """``padded_to``: the array is that long, ``expected`` its real prefix;
        the tail's values are unspecified, only bounded by ``tail_range`` when given."""
        obs = self._present(name, ("numpy", "torch"), expected)
        if obs is None:
            return
        actual = np.asarray(obs.values)
        if padded_to is not None and padded_to != len(expected):
            if actual.shape != (padded_to,):
                self._add(name, tuple(dict.fromkeys(row_ids)), f"shape ({padded_to},)", actual.shape,
                          f"shape {actual.shape}, expected ({padded_to},): padded to the descriptor")
                return
            tail = actual[len(expected):].astype(np.int64)
            if tail_range is not None and tail.size and not (
                    tail_range[0] <= tail.min() and tail.max() < tail_range[1]):
                self._add(name, (), f"padding values in [{tail_range[0]}, {tail_range[1]})", tail,
                          "a padded token carries a value no lookup can take")
            actual = actual[: len(expected)]
        if actual.shape != expected.shape:
            self._add(name, tuple(dict.fromkeys(row_ids)), expected, actual,
                      f"shape {actual.shape}, expected {expected.shape}")
            return
        diff = np.flatnonzero(actual.astype(np.int64) != expected.astype(np.int64))
        if self.skip and row_ids:
            diff = np.array([i for i in diff if row_ids[min(i, len(row_ids) - 1)] not in self.skip],
                            dtype=np.int64)
        if diff.size:
            # query_start_loc / cu_num_logits have one more row than requests
            ids = tuple(dict.fromkeys(row_ids[min(i, len(row_ids) - 1)] for i in diff if row_ids))
            self._add(name, ids, expected, actual,
                      f"{diff.size} of {expected.size} values differ (first at index {int(diff[0])})",
                      at=int(diff[0]))
