"""``simrig demo``: the main job on the bundled defaults (what ``make demo`` runs).

    1. replay traces/samples and traces/recorded through the real input path
       -> reports/demo/replay/
    2. a short valid-mode fuzz campaign (regressions first)
       -> reports/demo/fuzz/
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="replay the bundled traces and run a short fuzz campaign",
                       description="Replay traces/samples and traces/recorded, then fuzz for "
                                   "--budget seconds; reports under --out.")
    p.add_argument("--out", default="reports/demo", metavar="DIR",
                   help="where the two reports go (default reports/demo)")
    p.add_argument("--budget", type=float, default=30.0, metavar="SECONDS",
                   help="fuzz budget (default 30)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simrig.cli import main

    out = Path(args.out)
    traces = [str(ROOT / "traces" / sub) for sub in ("samples", "recorded")
              if (ROOT / "traces" / sub).is_dir()]
    print("== simrig demo 1/2: replay the bundled traces ==", flush=True)
    replay_status = main(["replay", *traces, "--out", str(out / "replay")])
    print(f"\n== simrig demo 2/2: fuzz for {args.budget:.0f} s ==", flush=True)
    fuzz_status = main(["fuzz", "--budget", str(args.budget), "--seed", str(args.seed),
                        "--out", str(out / "fuzz"), "--regressions", str(ROOT / "traces" / "regressions")])
    print(f"\nreports: {out / 'replay' / 'report.html'}  {out / 'fuzz' / 'report.html'}")
    return max(replay_status, fuzz_status)
