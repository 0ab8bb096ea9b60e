"""The side-by-side tables of ``simrig compare`` (A = the first --vllm, B = the second).

    classes   one row per finding class (kind, stage, field, check, exception):
              A only / B only / both, counts and which known-findings entry explained it
    contract  every (stage, field): its kind:dtype on each side; same / differs /
              A only / B only (a field one release lacks is never a difference)
    latency   per stage: seconds per round on each side, ratio B/A with a
              bootstrap 95 % interval over interleaved rounds, verdict
    values    per (stage, field): steps where both sides have the field and its
              values differ (dtype ignored) -- where behaviour changed
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from simrig.bench.stats import bootstrap_ratio
from simrig.releases.side import CLASS_KEY, SEP

A_ONLY, B_ONLY, BOTH, SAME, DIFFERS = "A only", "B only", "both", "same", "differs"


def class_diff(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    key = list(CLASS_KEY)
    keep = [*key, "count", "known", "known_by"]
    merged = a[keep].merge(b[keep], on=key, how="outer", suffixes=("_a", "_b"), indicator=True)
    merged["side"] = merged["_merge"].map({"left_only": A_ONLY, "right_only": B_ONLY,
                                           "both": BOTH}).astype(str)
    merged = merged.drop(columns="_merge")
    for col in ("count_a", "count_b"):
        merged[col] = merged[col].fillna(0).astype(int)
    for col in ("known_by_a", "known_by_b"):
        merged[col] = merged[col].fillna("")
    for col in ("known_a", "known_b"):
        merged[col] = merged[col].astype("boolean")
    return merged.sort_values(["side", *key], kind="stable").reset_index(drop=True)


def contract_diff(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    def per_field(frame: pd.DataFrame) -> pd.Series:
        typed = frame["kind"] + ":" + frame["dtype"]
        return typed.groupby([frame["stage"], frame["field"]]).agg(lambda s: ",".join(sorted(set(s))))

    left, right = per_field(a).rename("a"), per_field(b).rename("b")
    out = pd.concat([left, right], axis=1).reset_index()
    out.columns = ["stage", "field", "a", "b"]
    out["status"] = [A_ONLY if pd.isna(y) else B_ONLY if pd.isna(x) else SAME if x == y else DIFFERS
                     for x, y in zip(out["a"], out["b"])]
    out[["a", "b"]] = out[["a", "b"]].fillna("")
    return out.sort_values(["stage", "field"], kind="stable").reset_index(drop=True)


def latency(rounds_a: Sequence[dict[str, float]], rounds_b: Sequence[dict[str, float]]
            ) -> tuple[pd.DataFrame, list[str]]:
    """Per stage, over the (stage, trace) runs both sides made: (rows, runs only one side made).

    A stage one release cannot drive on a trace (e.g. PCP decode sharding on
    0.31) is left out of both sides' sums for that trace, so a ratio always
    compares the same work."""
    keys_a, keys_b = set().union(*rounds_a), set().union(*rounds_b)
    shared = keys_a & keys_b
    stages = sorted({k.split(SEP, 1)[0] for k in shared})
    rows = []
    for stage in stages:
        keys = [k for k in shared if k.split(SEP, 1)[0] == stage]
        a = [sum(r.get(k, 0.0) for k in keys) for r in rounds_a]
        b = [sum(r.get(k, 0.0) for k in keys) for r in rounds_b]
        r = bootstrap_ratio(a, b)
        rows.append({"stage": stage, "a_ms_per_round": 1e3 * sum(a) / len(a),
                     "b_ms_per_round": 1e3 * sum(b) / len(b), "ratio_b_over_a": r.ratio,
                     "ci_low": r.low, "ci_high": r.high, "rounds": r.rounds, "verdict": r.verdict})
    frame = pd.DataFrame(rows, columns=["stage", "a_ms_per_round", "b_ms_per_round",
                                        "ratio_b_over_a", "ci_low", "ci_high", "rounds", "verdict"])
    unshared = sorted(k.replace(SEP, " on ") + (" (A only)" if k in keys_a else " (B only)")
                      for k in keys_a ^ keys_b)
    return frame, unshared


def value_diff(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(per stage/field rows where values differ on the same step, fields compared)."""
    on = ["trace", "pcp_size", "step", "stage", "rank", "field"]
    both = a.merge(b, on=on, suffixes=("_a", "_b"))
    both["differs"] = both["digest_a"] != both["digest_b"]
    grouped = both.groupby(["stage", "field"], sort=True)
    summary = grouped.agg(compared=("differs", "size"), differing=("differs", "sum")).reset_index()
    first = (both[both["differs"]].groupby(["stage", "field"], sort=True)
             .first()[["trace", "pcp_size", "step", "rank"]].reset_index())
    out = summary[summary["differing"] > 0].merge(first, on=["stage", "field"], how="left")
    out = out.rename(columns={"trace": "first_trace", "step": "first_step",
                              "pcp_size": "first_pcp_size", "rank": "first_rank"})
    return out.reset_index(drop=True), len(summary)


def drop_fields(values: pd.DataFrame, fields: set[tuple[str, str]]) -> pd.DataFrame:
    """``values`` without the (stage, field) pairs in ``fields``."""
    if not fields:
        return values
    pairs = pd.MultiIndex.from_frame(values[["stage", "field"]])
    return values[~pairs.isin(list(fields))]
