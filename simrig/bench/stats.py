"""Ratios of interleaved timing rounds, with a bootstrap confidence interval.

On a shared machine two runs of identical code can differ by 2x in median, so
a ratio B/A is only reported with its uncertainty. A and B are measured in
rounds, interleaved (A, B, A, B, ...) so both sides see the same load; the
ratio is mean(B) / mean(A) over the rounds, and its 95 % interval comes from
resampling the round *pairs* with replacement (a paired bootstrap keeps each
round's shared load together).

    verdict: interval entirely below 1 -> "faster" (B takes less time)
             interval entirely above 1 -> "slower"
             interval contains 1       -> "within noise"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

FASTER, SLOWER, NOISE = "faster", "slower", "within noise"
TOO_FEW = "too few rounds"
MIN_ROUNDS = 3  # below this the bootstrap interval says nothing


class Ratio(NamedTuple):
    ratio: float  # mean(B) / mean(A)
    low: float  # 95 % bootstrap interval
    high: float
    rounds: int
    verdict: str


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], *, resamples: int = 2000,
                    seed: int = 0, level: float = 0.95) -> Ratio:
    """Paired bootstrap of mean(b)/mean(a) over rounds (``a[i]``, ``b[i]`` measured together)."""
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a_arr.shape != b_arr.shape or a_arr.ndim != 1 or len(a_arr) == 0:
        raise ValueError(f"rounds: need the same positive number for A and B, got "
                         f"{a_arr.shape} and {b_arr.shape}")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"resamples must be >= 1 and 0 < level < 1, got {resamples}, {level}")
    if a_arr.sum() <= 0:
        return Ratio(float("nan"), float("nan"), float("nan"), len(a_arr), NOISE)
    point = float(b_arr.mean() / a_arr.mean())
    if len(a_arr) < MIN_ROUNDS:
        return Ratio(point, float("nan"), float("nan"), len(a_arr), TOO_FEW)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a_arr), size=(resamples, len(a_arr)))
    den = a_arr[idx].mean(axis=1)
    ratios = b_arr[idx].mean(axis=1) / np.where(den > 0, den, np.nan)
    tail = (1 - level) / 2 * 100
    low, high = np.nanpercentile(ratios, [tail, 100 - tail])
    return Ratio(point, float(low), float(high), len(a_arr), verdict(float(low), float(high)))


def verdict(low: float, high: float) -> str:
    if high < 1.0:
        return FASTER
    if low > 1.0:
        return SLOWER
    return NOISE
