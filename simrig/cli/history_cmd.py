"""``simrig history``: trends and per-class first seen / last seen / fixed since
(a later replay of the same traces no longer shows it) or not seen since (a later
fuzz or selftest run merely did not hit it)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "history", help="trends over earlier replay / fuzz / selftest runs, per finding class",
        description="Read the history store every replay, fuzz and selftest run appends to "
                    "(SIMRIG_HISTORY, default reports/history) and write a page: classes "
                    "new/known/expected/fixed per run, steps/s, examples/s, mutants detected; "
                    "per class first seen, last seen, vLLM versions, fixed since <run> (a later "
                    "replay of the same traces no longer shows it) or not seen since <run> (a later "
                    "fuzz / selftest run did not hit it). Files that are not a complete run (temporary "
                    ".tmp-* files of an append, unreadable files, classes with no run row) are skipped; "
                    "--verbose lists them.",
        epilog="exit status: 0 page written; 2 bad arguments or no store")
    p.add_argument("--since", metavar="DATE",
                   help="only runs from this UTC date/time on (ISO, e.g. 2026-11-01)")
    p.add_argument("--store", metavar="DIR", help="history store (default: $SIMRIG_HISTORY or "
                                                  "reports/history)")
    p.add_argument("--out", metavar="FILE", help="page to write (default: STORE/history.html)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    from simrig.history.page import history_summary, render_history
    from simrig.history.store import StoreListing, load_history
    from simrig.cli.flags import emit_json, open_history_store

    store = open_history_store(args)
    listing = StoreListing()
    runs, classes = load_history(store, args.since, listing)  # a bad file: a warning, skipped
    if getattr(args, "verbose", False):
        for path in listing.temporary:
            print(f"history: ignored {path}: temporary (an append in progress, or one killed "
                  f"mid-write)", file=sys.stderr)
        for path, why in listing.unreadable:
            print(f"history: ignored {path}: unreadable ({why})", file=sys.stderr)
        for path in listing.orphans:
            print(f"history: ignored {path}: partial (classes with no run row: an append "
                  f"in progress, or one interrupted)", file=sys.stderr)
    out = Path(args.out) if args.out else store / "history.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_page(out, render_history(runs, classes, args.since))
    summary = {**history_summary(runs, classes), "page": str(out)}
    if args.json:
        emit_json(summary)
        return 0
    print(f"history: {summary['runs']} run(s), {summary['classes']} class line(s), "
          f"{len(summary['fixed'])} fixed, {len(summary['not_seen'])} not seen since, "
          f"{len(summary['still_new'])} new still showing")
    for item in summary["fixed"][:10]:
        print(f"  fixed since {item['fixed_since']} ({item['fixed_since_run']}): "
              f"[{item['suite']}] {item['signature']}")
    for item in summary["not_seen"][:10]:
        print(f"  not seen since {item['not_seen_since']} ({item['not_seen_since_run']}): "
              f"[{item['suite']}] {item['signature']}")
    for item in summary["still_new"][:10]:
        print(f"  NEW since {item['first_seen']}: [{item['suite']}] {item['signature']}")
    for item in summary["coverage_drops"][:10]:
        print(f"  COVERAGE DROP {item['created_utc']} ({item['run_id']}): [{item['suite']}] "
              f"lines {item['change_lines']:+.2f} pts, branches {item['change_branches']:+.2f} pts")
    print(f"page: {out}")
    return 0


def _write_page(out: Path, text: str) -> None:
    """Write ``out`` through a temp file of its own, renamed into place: two
    ``simrig history`` at once each write whole pages, and a reader never sees half."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{out.name}-", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; the page is not
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
