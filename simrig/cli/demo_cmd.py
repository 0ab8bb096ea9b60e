"""``simrig demo``: the main job on the bundled defaults (what ``make demo`` runs).

    1. replay traces/samples, traces/recorded and traces/regressions (whose
       headers declare the KeyErrors they must produce) -> reports/demo/replay/
       (both reports carry the coverage of vLLM's MRV2 code unless --no-coverage)
    2. a short valid-mode fuzz campaign (regressions first) -> reports/demo/fuzz/
    3. the history page over every recorded run -> reports/demo/history.html
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simrig.errors import EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]


DESCRIPTION = """Replay traces/samples, traces/recorded and traces/regressions, fuzz for
    --budget seconds, then render the history page; reports under --out."""
EPILOG = """exit status: the worse of the replay and the fuzz campaign (0 nothing new, 1 a
    new finding class, 2 bad arguments, an unwritable --out or a malformed --known file, 3 a
    bug in simrig)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", description=DESCRIPTION, epilog=EPILOG,
                       help="replay the bundled traces and run a short fuzz campaign")
    p.add_argument("--out", default="reports/demo", metavar="DIR",
                   help="where the two reports go (default reports/demo)")
    p.add_argument("--budget", type=float, default=30.0, metavar="SECONDS",
                   help="fuzz budget (default 30)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.add_argument("--coverage", action=argparse.BooleanOptionalAction, default=True,
                   help="coverage of vLLM's MRV2 code in both reports (default on; --no-coverage "
                        "roughly halves the time per step on CPU)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # at call time: the dispatch imports this module first (and a test may replace its main)
    from simrig.cli.dispatch import main
    from simrig.history.store import history_dir  # cold path: pandas, off `simrig --help`
    from simrig.report.writer import check_out_dir  # cold path: pandas, off `simrig --help`

    out = Path(args.out)
    for part in ("replay", "fuzz"):  # both folders, before ten minutes of work
        check_out_dir(out / part)
    known = ["--known", args.known] if args.known else []
    known += ["--coverage" if args.coverage else "--no-coverage"]

    traces = [str(ROOT / "traces" / sub) for sub in ("samples", "recorded", "regressions")
              if (ROOT / "traces" / sub).is_dir()]
    print("== simrig demo 1/3: replay the bundled traces ==", flush=True)
    replay_status = main(["replay", *traces, "--out", str(out / "replay"), *known])
    if replay_status == EXIT_USAGE:  # its one line is already on stderr
        return replay_status
    print(f"\n== simrig demo 2/3: fuzz for {args.budget:.0f} s ==", flush=True)
    fuzz_status = main(["fuzz", "--budget", str(args.budget), "--seed", str(args.seed),
                        "--out", str(out / "fuzz"), "--regressions", str(ROOT / "traces" / "regressions"),
                        *known])
    pages = [out / "replay" / "report.html", out / "fuzz" / "report.html"]
    if history_dir() is not None:
        print("\n== simrig demo 3/3: history of every recorded run ==", flush=True)
        if main(["history", "--out", str(out / "history.html")]) == 0:
            pages.append(out / "history.html")
    print("\nreports: " + "  ".join(map(str, pages)))
    return max(replay_status, fuzz_status)
