"""The branches of vLLM's MRV2 code no recorded run ever reached, per vLLM version.

``never_reached_command`` is ``simrig coverage``'s work: every run with coverage in the
history store (``simrig.history.store.load_coverage``), its never-reached branches with
their source line, printed (or ``--json``) and optionally written as CSV or parquet.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simrig.coverage.collect import vllm_root
from simrig.errors import UsageError
from simrig.history.store import load_coverage, load_history, never_reached_branches
from simrig.report.html import emit_json


def never_reached_command(store: Path, since: str | None, vllm: str | None, out: str | None,
                          json_out: bool) -> int:
    """Per vLLM version (``vllm``: only that one): runs, branch arcs in driven functions and
    those never reached; UsageError when the store holds no run with coverage."""
    runs, _ = load_history(store, since)
    if vllm:
        runs = runs[runs["vllm_version"] == vllm]
    coverage = load_coverage(store, runs)
    if coverage.empty:
        raise UsageError(f"--store: {store} holds no run with coverage"
                         + (f" on vLLM {vllm}" if vllm else "")
                         + " (run replay / fuzz / selftest with --coverage)")
    never = never_reached_branches(coverage)
    _add_source(never)
    versions = []
    for version, g in coverage.groupby("vllm_version", sort=True):
        branches = g.drop_duplicates(["file", "function", "line", "to_line"])
        missing = never[never["vllm_version"] == version]
        versions.append({"vllm_version": version, "runs": int(g["run_id"].nunique()),
                         "branches": len(branches), "never_reached": len(missing)})
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        (never.to_csv(path, index=False) if path.suffix == ".csv" else never.to_parquet(path, index=False))
    if json_out:
        emit_json({"versions": versions, "never_reached": never.to_dict("records")})
        return 0
    for v in versions:
        print(f"vLLM {v['vllm_version']}: {v['runs']} run(s) with coverage, {v['branches']} branch arcs in "
              f"driven functions, {v['never_reached']} never reached by any run")
        for r in never[never["vllm_version"] == v["vllm_version"]].itertuples(index=False):
            to = "exit" if r.to_line < 0 else str(r.to_line)
            print(f"  {r.file}:{r.line} -> {to}  {r.function}  {r.source}")
    return 0


def _add_source(never: pd.DataFrame) -> None:
    """The branch line's source, where the installed vLLM has the file (same version)."""
    root, cache = vllm_root(), {}
    texts = []
    for r in never.itertuples(index=False):
        lines = cache.get(r.file)
        if lines is None and root is not None and (root / r.file).is_file():
            lines = cache[r.file] = (root / r.file).read_text(encoding="utf-8").splitlines()
        texts.append(lines[r.line - 1].strip() if lines and 0 < r.line <= len(lines) else "")
    never["source"] = texts
