"""``simrig history``: trends and per-class first seen / last seen / fixed since."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "history", help="trends over earlier replay / fuzz / selftest runs, per finding class",
        description="Read the history store every replay, fuzz and selftest run appends to "
                    "(SIMRIG_HISTORY, default reports/history) and write a page: classes "
                    "new/known/expected/fixed per run, steps/s, examples/s, mutants detected; "
                    "per class first seen, last seen, vLLM versions, fixed since <run>.",
        epilog="exit status: 0 page written; 2 bad arguments or an unreadable store")
    p.add_argument("--since", metavar="DATE",
                   help="only runs from this UTC date/time on (ISO, e.g. 2026-11-01)")
    p.add_argument("--store", metavar="DIR", help="history store (default: $SIMRIG_HISTORY or "
                                                  "reports/history)")
    p.add_argument("--out", metavar="FILE", help="page to write (default: STORE/history.html)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datetime import datetime

    from simrig.commands.common import emit_json
    from simrig.errors import UsageError
    from simrig.report.history import history_dir, load_history
    from simrig.report.history_page import history_summary, render_history

    store = Path(args.store) if args.store else history_dir()
    if store is None:
        raise UsageError("--store: history recording is off (SIMRIG_HISTORY=none); name a store")
    if args.since:
        try:
            datetime.fromisoformat(args.since)
        except ValueError:
            raise UsageError(f"--since: not an ISO date/time: {args.since!r}") from None
    if not (store / "runs").is_dir():
        raise UsageError(f"--store: {store} holds no history yet (runs/ is missing)")
    try:
        runs, classes = load_history(store, args.since)
    except Exception as exc:  # noqa: BLE001 -- a corrupt parquet file: name it, no traceback
        raise UsageError(f"{store}: cannot read the history store ({exc})") from None
    out = Path(args.out) if args.out else store / "history.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.write_text(render_history(runs, classes, args.since), encoding="utf-8")
    tmp.replace(out)
    summary = {**history_summary(runs, classes), "page": str(out)}
    if args.json:
        emit_json(summary)
        return 0
    print(f"history: {summary['runs']} run(s), {summary['classes']} class line(s), "
          f"{len(summary['fixed'])} fixed, {len(summary['still_new'])} new still showing")
    for item in summary["fixed"][:10]:
        print(f"  fixed since {item['fixed_since']} ({item['fixed_since_run']}): "
              f"[{item['suite']}] {item['signature']}")
    for item in summary["still_new"][:10]:
        print(f"  NEW since {item['first_seen']}: [{item['suite']}] {item['signature']}")
    print(f"page: {out}")
    return 0
