"""``simrig coverage``: the branches of vLLM's MRV2 code no recorded run ever reached.

Reads the history store (``simrig history``'s): every replay, fuzz or selftest
run made with ``--coverage`` keeps the branch arcs of the functions it drove,
reached or not (``coverage/<run id>.parquet``). Per vLLM version, a branch is
*never reached* when some run drove its function and no run took it.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "coverage", help="branches of the MRV2 code no run in the history ever reached, per vLLM version",
        description="Read the history store and list, per vLLM version, every branch of a driven "
                    "MRV2 function that no run recorded with --coverage ever took.",
        epilog="exit status: 0 listed (also when every branch was reached); 2 bad arguments, "
               "a store with no history, or no run with coverage (one line on stderr)")
    p.add_argument("--store", metavar="DIR", default=None,
                   help="history store (default: SIMRIG_HISTORY or reports/history)")
    p.add_argument("--vllm", metavar="VERSION", default=None,
                   help="only this vLLM version (default: every version in the store)")
    p.add_argument("--since", metavar="ISO", default=None, help="only runs from this date/time on")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="also write the never-reached branches as CSV (FILE.csv) or parquet (FILE.parquet)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    from simrig.errors import UsageError
    from simrig.history.store import load_coverage, load_history, never_reached_branches
    from simrig.cli.flags import emit_json, open_history_store

    if args.out and not str(args.out).endswith((".csv", ".parquet")):
        raise UsageError(f"--out: {args.out}: name a .csv or .parquet file")
    store = open_history_store(args)
    runs, _ = load_history(store, args.since)
    if args.vllm:
        runs = runs[runs["vllm_version"] == args.vllm]
    coverage = load_coverage(store, runs)
    if coverage.empty:
        raise UsageError(f"--store: {store} holds no run with coverage"
                         + (f" on vLLM {args.vllm}" if args.vllm else "")
                         + " (run replay / fuzz / selftest with --coverage)")
    never = never_reached_branches(coverage)
    _add_source(never)
    versions = []
    for version, g in coverage.groupby("vllm_version", sort=True):
        branches = g.drop_duplicates(["file", "function", "line", "to_line"])
        missing = never[never["vllm_version"] == version]
        versions.append({"vllm_version": version, "runs": int(g["run_id"].nunique()),
                         "branches": len(branches), "never_reached": len(missing)})
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        (never.to_csv(out, index=False) if out.suffix == ".csv" else never.to_parquet(out, index=False))
    if args.json:
        emit_json({"versions": versions, "never_reached": never.to_dict("records")})
        return 0
    for v in versions:
        print(f"vLLM {v['vllm_version']}: {v['runs']} run(s) with coverage, {v['branches']} branch arcs in "
              f"driven functions, {v['never_reached']} never reached by any run")
        for r in never[never["vllm_version"] == v["vllm_version"]].itertuples(index=False):
            to = "exit" if r.to_line < 0 else str(r.to_line)
            print(f"  {r.file}:{r.line} -> {to}  {r.function}  {r.source}")
    return 0


def _add_source(never) -> None:
    """The branch line's source, where the installed vLLM has the file (same version)."""
    from simrig.coverage.collect import vllm_root

    root, cache = vllm_root(), {}
    texts = []
    for r in never.itertuples(index=False):
        lines = cache.get(r.file)
        if lines is None and root is not None and (root / r.file).is_file():
            lines = cache[r.file] = (root / r.file).read_text(encoding="utf-8").splitlines()
        texts.append(lines[r.line - 1].strip() if lines and 0 < r.line <= len(lines) else "")
    never["source"] = texts
