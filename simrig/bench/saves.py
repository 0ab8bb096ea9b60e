"""``simrig bench --compare``: saved benchmark runs compared as two sets of
saves, B/A per benchmark, with a verdict only where the saves support one.

Two saves of identical code can differ by 2x on a shared machine, so ``compare``
measures the noise *between saves* (``between_saves``: a t interval on the log
medians, family-wise 95 % over the table) and calls a row slower or faster only
beyond ``MIN_EFFECT``.

See docs/benchmarks.md, 'Benchmarks' for the rule and an A/A check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from simrig.errors import UsageError

FASTER, SLOWER, NOISE, CANNOT_TELL = "faster", "slower", "within noise", "cannot tell"
MIN_SAVES = 2  # per side, for a verdict
MIN_EFFECT = 0.05  # a verdict needs the interval to clear 1 by this much
FAMILY_ALPHA = 0.05  # the whole table's chance of one false verdict (A/A)
STATUS_REGRESSED, STATUS_OK = "regressed", "ok"
STATUS_UNVERIFIED = "over limit, cannot tell"
STATUS_ONLY_A, STATUS_ONLY_B = "only in A", "only in B"
TABLE_COLUMNS = ("name", "group", "saves_a", "saves_b", "min_a", "min_b", "min_ratio", "median_a",
                 "median_b", "median_ratio", "ci_low", "ci_high", "verdict", "status", "fullname")


# -------------------------------------------------------------- t quantile
def _t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3/4)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/pi * (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(level: float, df: int) -> float:
    """t such that P(|T| < t) = level (two-sided), for integer df >= 1."""
    if not 0 < level < 1 or df < 1:
        raise ValueError(f"t_quantile: need 0 < level < 1 and df >= 1, got {level}, {df}")
    low, high = 0.0, 1.0
    while _t_two_sided(high, df) < level:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if _t_two_sided(mid, df) < level:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * high:
            break
    return (low + high) / 2


# ------------------------------------------------------------ one benchmark
def between_saves(medians_a: Sequence[float], medians_b: Sequence[float], *, level: float,
                  min_effect: float = MIN_EFFECT) -> tuple[float, float, float, str]:
    """(ratio, low, high, verdict) of B/A from per-save medians.

    The noise is measured *between saves* (the rounds inside one run share its load)::

        x_i = log(median of save i)          one number per save
        ratio   = exp(mean x_B - mean x_A)   B/A of the geometric means of the medians
        s^2     = pooled variance of x over both sides, df = n_A + n_B - 2
        interval = exp((mean x_B - mean x_A) +- t(df) * s * sqrt(1/n_A + 1/n_B))

        verdict  "slower"        interval above 1 + min_effect (5 %)
                 "faster"        interval below 1 / (1 + min_effect) (about 0.952)
                 "within noise"  otherwise
                 "cannot tell"   fewer than 2 saves on a side: no between-save spread

    ``level`` is the family-wise level per row (``compare`` passes 1 - 0.05/m, Bonferroni).
    """
    xa, xb = np.log(np.asarray(medians_a, float)), np.log(np.asarray(medians_b, float))
    diff = float(xb.mean() - xa.mean())
    na, nb = len(xa), len(xb)
    if min(na, nb) < MIN_SAVES:
        return math.exp(diff), math.nan, math.nan, CANNOT_TELL
    df = na + nb - 2
    pooled = (float(((xa - xa.mean()) ** 2).sum()) + float(((xb - xb.mean()) ** 2).sum())) / df
    half = t_quantile(level, df) * math.sqrt(pooled * (1 / na + 1 / nb))
    low, high = math.exp(diff - half), math.exp(diff + half)
    if low > 1 + min_effect:
        verdict = SLOWER
    elif high < 1 / (1 + min_effect):
        verdict = FASTER
    else:
        verdict = NOISE
    return math.exp(diff), low, high, verdict


# --------------------------------------------------------------- the table
def _per_save(frames: Sequence[pd.DataFrame], field: str) -> pd.DataFrame:
    """benchmark x save: one column per save (NaN where a save lacks it)."""
    return pd.concat([f.drop_duplicates("fullname").set_index("fullname")[field].rename(i)
                      for i, f in enumerate(frames)], axis=1)


def compare(a: pd.DataFrame | Sequence[pd.DataFrame], b: pd.DataFrame | Sequence[pd.DataFrame],
            fail_pct: float | None = None, *, min_effect: float = MIN_EFFECT,
            family_alpha: float = FAMILY_ALPHA) -> pd.DataFrame:
    """B/A per benchmark (matched by full name) over two sets of saved runs,
    worst median ratio first. A single frame is a set of one save.

    median_a / median_b: geometric mean over the side's saves of each save's
    median; min_a / min_b: the smallest time of any save. status: "regressed"
    when the verdict is slower and median B/A > 1 + fail_pct/100; "over limit,
    cannot tell" when the ratio is over that limit but a side has one save;
    "ok" otherwise (always without fail_pct); "only in A" / "only in B".
    """
    if fail_pct is not None and (not math.isfinite(fail_pct) or fail_pct < 0):
        raise UsageError(f"--fail-on-regression {fail_pct}: must be a percentage >= 0")
    if not math.isfinite(min_effect) or min_effect < 0:
        raise UsageError(f"--min-effect {min_effect * 100:g}: must be a percentage >= 0")
    sides = [[x] if isinstance(x, pd.DataFrame) else list(x) for x in (a, b)]
    if not sides[0] or not sides[1]:
        raise UsageError("--compare: each side needs at least one run")
    med = [_per_save(frames, "median") for frames in sides]
    mins = [_per_save(frames, "min") for frames in sides]
    meta = pd.concat([f[["fullname", "name", "group"]] for frames in sides for f in frames]
                     ).drop_duplicates("fullname").set_index("fullname")
    names = sorted(set(med[0].index) | set(med[1].index))

    def values(side: int, name: str) -> np.ndarray:
        if name not in med[side].index:
            return np.array([])
        row = med[side].loc[name].to_numpy(float)
        return row[np.isfinite(row) & (row > 0)]

    judged = sum(1 for n in names if min(len(values(0, n)), len(values(1, n))) >= MIN_SAVES)
    level = 1 - family_alpha / max(judged, 1)
    limit = math.inf if fail_pct is None else 1 + fail_pct / 100
    rows = []
    for name in names:
        va, vb = values(0, name), values(1, name)
        row = {"fullname": name, "name": meta.loc[name, "name"], "group": meta.loc[name, "group"],
               "saves_a": len(va), "saves_b": len(vb),
               "min_a": float(mins[0].loc[name].min()) if len(va) else math.nan,
               "min_b": float(mins[1].loc[name].min()) if len(vb) else math.nan,
               "median_a": float(np.exp(np.log(va).mean())) if len(va) else math.nan,
               "median_b": float(np.exp(np.log(vb).mean())) if len(vb) else math.nan,
               "median_ratio": math.nan, "ci_low": math.nan, "ci_high": math.nan}
        if not len(va) or not len(vb):
            row.update(verdict="-", status=STATUS_ONLY_B if len(vb) else STATUS_ONLY_A)
        else:
            ratio, low, high, verdict = between_saves(va, vb, level=level, min_effect=min_effect)
            status = STATUS_OK
            if ratio > limit and verdict == SLOWER:
                status = STATUS_REGRESSED
            elif ratio > limit and verdict == CANNOT_TELL:
                status = STATUS_UNVERIFIED
            row.update(median_ratio=ratio, ci_low=low, ci_high=high, verdict=verdict, status=status)
        row["min_ratio"] = row["min_b"] / row["min_a"]
        rows.append(row)
    out = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    out = out.sort_values(["median_ratio", "fullname"], ascending=[False, True],
                          na_position="last", kind="stable").reset_index(drop=True)
    paths = [[f.attrs.get("path", side) for f in frames] for frames, side in zip(sides, "AB")]
    out.attrs.update(a_paths=paths[0], b_paths=paths[1], a_path=paths[0][0], b_path=paths[1][0],
                     fail_pct=fail_pct, min_effect=min_effect, family_alpha=family_alpha,
                     judged=judged, level=level)
    return out


def regressions(table: pd.DataFrame) -> pd.DataFrame:
    """Rows shown slower beyond --fail-on-regression by the saves."""
    return table[table["status"] == STATUS_REGRESSED]


def unverified(table: pd.DataFrame) -> pd.DataFrame:
    """Rows over the --fail-on-regression limit that one save per side cannot confirm."""
    return table[table["status"] == STATUS_UNVERIFIED]
