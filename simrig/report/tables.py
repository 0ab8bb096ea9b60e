"""Compact, append-only tables for per-step rows (replay and campaigns)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

_EMPTY = {"str": "", "int64": 0, "float64": float("nan"), "bool": False}


def kind_of(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int64"
    if isinstance(value, (float, np.floating)):
        return "float64"
    return "str"


class ColumnTable:
    """Append-only rows kept as typed NumPy chunks, strings as int32 codes.

        append(row) -> pending tuples (<= chunk_rows)
                        | full: one array per column
                        v
                      chunks  --to_frame()-->  DataFrame (strings as Categoricals)

    A row costs a few dozen bytes instead of a dict's kilobyte. Columns are
    fixed by the constructor or by the first row.
    """

    def __init__(self, columns: dict[str, str] | None = None, chunk_rows: int = 16_384):
        self.columns: dict[str, str] = {}
        self.chunk_rows = chunk_rows
        self._pending: list[tuple] = []
        self._rows = 0
        if columns:
            self._define(columns)

    def _define(self, columns: dict[str, str]) -> None:
        self.columns = dict(columns)
        self._chunks: dict[str, list[np.ndarray]] = {c: [] for c in self.columns}
        self._vocab: dict[str, dict[str, int]] = {c: {} for c, k in self.columns.items() if k == "str"}

    def __len__(self) -> int:
        return self._rows

    def append(self, row: dict[str, Any]) -> None:
        if not self.columns:
            self._define({c: kind_of(v) for c, v in row.items()})
        self.append_values(*(row.get(c, _EMPTY[k]) for c, k in self.columns.items()))

    def append_values(self, *values: Any) -> None:
        """Values in column order (the hot path: no dict per row)."""
        self._pending.append(values)
        self._rows += 1
        if len(self._pending) >= self.chunk_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        for col, values in zip(self.columns, zip(*self._pending)):
            if self.columns[col] == "str":
                vocab = self._vocab[col]
                codes = [vocab.setdefault("" if v is None else str(v), len(vocab)) for v in values]
                self._chunks[col].append(np.asarray(codes, dtype=np.int32))
            else:
                self._chunks[col].append(np.asarray(values, dtype=self.columns[col]))
        self._pending = []

    def to_frame(self) -> pd.DataFrame:
        """All rows so far, as a DataFrame (the table stays appendable)."""
        self._flush()
        data: dict[str, Any] = {}
        for col, kind in self.columns.items():
            parts = self._chunks[col]
            empty = np.empty(0, dtype=np.int32 if kind == "str" else kind)
            arr = np.concatenate(parts) if parts else empty
            if kind == "str":
                data[col] = pd.Categorical.from_codes(arr, categories=list(self._vocab[col]))
            else:
                data[col] = arr
        return pd.DataFrame(data, columns=list(self.columns))
