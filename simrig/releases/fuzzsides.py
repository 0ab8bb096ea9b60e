"""The same seeded fuzz campaign on both sides of a comparison.

Each side runs ``simrig fuzz --seed 0 --database none --mode valid`` with its
own interpreter (its own vLLM) for the same budget; the finding classes it
reports join that side's replay classes, so ``B only`` covers both.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd

from simrig.errors import UsageError
from simrig.releases import diff
from simrig.releases.envs import PROJECT, SideSpec
from simrig.releases.side import CLASS_KEY


def run_side(side: SideSpec, budget: float, out: Path) -> pd.DataFrame:
    """The campaign's finding classes on one side (CLASS_KEY, count, known, known_by)."""
    cmd = [side.python, "-m", "simrig.cli", "fuzz", "--budget", str(budget), "--seed", "0",
           "--database", "none", "--mode", "valid", "--no-regressions", "--progress", "quiet",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT)
    if proc.returncode not in (0, 1):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--vllm {side.spec}: the fuzz campaign failed: {last}")
    frame = pd.read_csv(out / "findings.csv", keep_default_na=False) \
        if (out / "findings.csv").stat().st_size else pd.DataFrame()
    cols = [*CLASS_KEY, "count", "known", "known_by"]
    if frame.empty:
        return pd.DataFrame(columns=cols)
    for col in cols:
        if col not in frame.columns:
            frame[col] = "" if col != "count" else 1
    frame["known"] = frame["known"].astype(str).str.lower() == "true"
    return frame[cols]


def fuzz_classes(result, a: SideSpec, b: SideSpec, budget: float, work: Path, log=print) -> None:
    """Add both campaigns' classes to ``result`` (classes table and summary)."""
    log(f"compare: seeded fuzz campaign, {budget:g} s per side")
    fa, fb = run_side(a, budget, work / "fuzz-A"), run_side(b, budget, work / "fuzz-B")

    def merged(replay: pd.DataFrame, fuzz: pd.DataFrame) -> pd.DataFrame:
        both = pd.concat([replay[[*CLASS_KEY, "count", "known", "known_by"]], fuzz],
                         ignore_index=True)
        both[list(CLASS_KEY)] = both[list(CLASS_KEY)].fillna("").astype(str)
        return (both.groupby(list(CLASS_KEY), as_index=False)
                .agg(count=("count", "sum"), known=("known", "first"), known_by=("known_by", "first")))

    result.classes = diff.class_diff(merged(result.a["classes"], fa), merged(result.b["classes"], fb))
    result.summary["classes"] = {s: int((result.classes["side"] == s).sum())
                                 for s in (diff.A_ONLY, diff.B_ONLY, diff.BOTH)}
    result.summary["fuzz_budget_s"] = budget
    result.summary["fuzz_classes"] = {"a": len(fa), "b": len(fb)}
