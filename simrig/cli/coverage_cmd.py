"""``simrig coverage``: the branches of vLLM's MRV2 code no recorded run ever reached.

Reads the history store (``simrig history``'s): every replay, fuzz or selftest
run made with ``--coverage`` keeps the branch arcs of the functions it drove,
reached or not. Per vLLM version, a branch is *never reached* when some run
drove its function and no run took it (``simrig.history.branches``).
"""

from __future__ import annotations

import argparse

from simrig.cli.flags import open_history_store
from simrig.errors import UsageError

DESCRIPTION = """Read the history store and list, per vLLM version, every branch of a driven
    MRV2 function that no run recorded with --coverage ever took."""
EPILOG = """exit status: 0 listed (also when every branch was reached); 2 bad arguments, a
    store with no history, or no run with coverage (one line on stderr)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("coverage", description=DESCRIPTION, epilog=EPILOG,
                       help="branches of the MRV2 code no run in the history ever reached, per vLLM version")
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
    from simrig.history.branches import never_reached_command  # cold path: pandas, off `simrig --help`

    if args.out and not str(args.out).endswith((".csv", ".parquet")):
        raise UsageError(f"--out: {args.out}: name a .csv or .parquet file")
    store = open_history_store(args)
    return never_reached_command(store, args.since, args.vllm, args.out, args.json)
