"""``simrig history``: trends and per-class first seen / last seen / fixed since
(a later replay of the same traces no longer shows it) or not seen since (a later
fuzz or selftest run merely did not hit it). The page and its lines are
``simrig.history.page.history_command``'s."""

from __future__ import annotations

import argparse
from pathlib import Path

from simrig.cli.flags import open_history_store

DESCRIPTION = """Read the history store every replay, fuzz and selftest run appends to
    (SIMRIG_HISTORY, default reports/history) and write a page: classes
    new/known/expected/fixed per run, steps/s, examples/s, mutants detected; per class
    first seen, last seen, vLLM versions, fixed since <run> (a later replay of the same
    traces no longer shows it) or not seen since <run> (a later fuzz / selftest run did not
    hit it). Files that are not a complete run (temporary .tmp-* files of an append,
    unreadable files, classes with no run row) are skipped; --verbose lists them."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("history", description=DESCRIPTION,
                       epilog="exit status: 0 page written; 2 bad arguments or no store",
                       help="trends over earlier replay / fuzz / selftest runs, per finding class")
    p.add_argument("--since", metavar="DATE",
                   help="only runs from this UTC date/time on (ISO, e.g. 2026-11-01)")
    p.add_argument("--store", metavar="DIR", help="history store (default: $SIMRIG_HISTORY or "
                                                  "reports/history)")
    p.add_argument("--out", metavar="FILE", help="page to write (default: STORE/history.html)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simrig.history.page import history_command  # cold path: pandas, off `simrig --help`

    store = open_history_store(args)
    out = Path(args.out) if args.out else store / "history.html"
    return history_command(store, args.since, out, verbose=getattr(args, "verbose", False),
                           json_out=args.json)
