"""``simrig bench``: run the pytest-benchmark suites, or compare saved runs.

Without ``--compare`` or ``--interleave`` it runs tests/bench; ``--compare RUNS_A RUNS_B``
compares two sets of saves (verdicts need 2+ saves per side); ``--interleave VLLM_A
VLLM_B`` runs both sides in alternating rounds. The work is ``simrig.bench.suites``'s;
see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simrig.errors import UsageError

DESCRIPTION = """Run tests/bench through pytest-benchmark (micro benchmarks of the MRV2
    indexing idioms, per-stage latency of the real input path, the rig's overhead), or
    compare sets of saved runs."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run the pytest-benchmark suites or compare saved runs",
                       description=DESCRIPTION)
    p.add_argument("--filter", metavar="EXPR", help="pytest -k expression selecting benchmarks")
    p.add_argument("--save", metavar="NAME", help="keep the run in the storage under NAME")
    p.add_argument("--storage", metavar="DIR", type=Path,
                   help="where saved runs live (default: .benchmarks/ in the checkout)")
    p.add_argument("--interleave", nargs=2, metavar=("VLLM_A", "VLLM_B"),
                   help="run the suites under two vLLMs (side venvs: a release X.Y.Z, a venv "
                        "path or 'installed') in interleaved rounds; ratios with a 95%% "
                        "bootstrap interval and a verdict")
    p.add_argument("--rounds", type=int, default=5, help="with --interleave: rounds per side (default 5)")
    p.add_argument("--compare", nargs=2, metavar=("RUNS_A", "RUNS_B"),
                   help="compare saved runs instead of running; each side is a run (file path, "
                        "saved name or number), a comma-separated list of runs (A1,A2,A3) or a "
                        "pattern ('base*'). Verdicts need 2+ saves per side, 3+ recommended; "
                        "one save per side says 'cannot tell'")
    p.add_argument("--min-effect", metavar="PCT", type=float,
                   help="with --compare: 'slower'/'faster' only when the interval clears 1 by "
                        "this much (default 5)")
    p.add_argument("--fail-on-regression", metavar="PCT", type=float,
                   help="with --compare: exit 1 when a median slows by more than PCT percent "
                        "(and the saves show it slower, or cannot tell with one save per side)")
    p.add_argument("--out", metavar="DIR", type=Path, default=Path("reports") / "bench",
                   help="with --compare: folder for the CSV and HTML (default: reports/bench)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simrig.bench import suites as bench  # cold path: pandas and numpy, off `simrig --help`

    if args.interleave is not None:
        from simrig.releases.envs import side_for_compare  # cold path (see above)

        a, b = (side_for_compare(spec) for spec in args.interleave)
        return bench.print_interleaved(a, b, args.rounds, args.filter)
    storage = args.storage or bench.default_storage()
    if args.compare is None:
        for flag, value in (("--fail-on-regression", args.fail_on_regression),
                            ("--min-effect", args.min_effect)):
            if value is not None:
                raise UsageError(f"{flag}: needs --compare RUNS_A RUNS_B")
        return bench.print_run(filter_expr=args.filter, save=args.save, storage=storage)
    if args.filter or args.save:
        raise UsageError("--compare: compares saved runs; drop --filter/--save")
    return bench.print_compare(*args.compare, storage, args.fail_on_regression, args.min_effect, args.out)
