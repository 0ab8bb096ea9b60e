"""``simrig bench``: run the pytest-benchmark suites, or compare saved runs.

    simrig bench [--filter EXPR] [--save NAME] [--storage DIR]
        run tests/bench (pytest-benchmark enabled), print the run's table,
        keep it as STORAGE/<machine>/NNNN_NAME.json with --save
    simrig bench --compare RUNS_A RUNS_B [--min-effect PCT] [--fail-on-regression PCT] [--out DIR]
        each side one run, A1,A2,A3 or a pattern ('base*'); ratio table B/A
        (terminal), CSV + HTML under --out. Verdicts need 2+ saves per side
        (the spread between saves is the noise), else "cannot tell".
        Exit 1 when a median ratio exceeds 1 + PCT/100 and the saves show it
        slower, or a side has one save and so cannot clear it
    simrig bench --interleave VLLM_A VLLM_B [--rounds N] [--filter EXPR]
        both sides in alternating rounds, paired bootstrap per benchmark
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="run the pytest-benchmark suites or compare saved runs",
        description="Run tests/bench through pytest-benchmark (micro benchmarks of the "
                    "MRV2 indexing idioms, per-stage latency of the real input path, the "
                    "rig's overhead), or compare sets of saved runs.")
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
    from simrig.bench import runner as bench
    from simrig.errors import UsageError

    if args.interleave is not None:
        return run_interleaved(args)
    storage = args.storage or bench.default_storage()
    if args.compare is None:
        for flag, value in (("--fail-on-regression", args.fail_on_regression),
                            ("--min-effect", args.min_effect)):
            if value is not None:
                raise UsageError(f"{flag}: needs --compare RUNS_A RUNS_B")
        status, frame = bench.run_suites(filter_expr=args.filter, save=args.save, storage=storage)
        if frame is not None:
            print()
            print(bench.run_markdown(frame))
            extra = bench.extra_markdown(frame)
            if extra:
                print()
                print(extra)
        if args.save and status == 0:
            print(f"saved as {args.save!r} in {storage}")
        return 0 if status == 0 else 1

    if args.filter or args.save:
        raise UsageError("--compare: compares saved runs; drop --filter/--save")
    paths_a = bench.resolve_side(args.compare[0], storage)
    paths_b = bench.resolve_side(args.compare[1], storage)
    effect = 5.0 if args.min_effect is None else args.min_effect
    table = bench.compare([bench.load_run(p) for p in paths_a], [bench.load_run(p) for p in paths_b],
                          args.fail_on_regression, min_effect=effect / 100)
    for side, paths, spec in (("A", paths_a, args.compare[0]), ("B", paths_b, args.compare[1])):
        print(f"{side} ({len(paths)} save{'s' if len(paths) > 1 else ''}): "
              + ", ".join(str(p) for p in paths))
        same_name = bench.saves_named(paths[0], storage) if len(paths) == 1 else 1
        if same_name > 1:
            print(f"  ({spec!r} is the latest of {same_name} saves of that name; "
                  f"'{paths[0].stem.split('_', 1)[1]}*' compares them all)")
    print()
    print(bench.compare_markdown(table))
    print()
    for line in bench.compare_notes(table):
        print(line)
    written = bench.write_compare(table, args.out)
    print()
    for path in written.values():
        print(f"wrote {path}")
    bad, unsure = bench.regressions(table), bench.unverified(table)
    if len(bad):
        worst = bad.iloc[0]
        print(f"{len(bad)} benchmark(s) slower beyond {args.fail_on_regression:g}%: "
              f"worst {worst['name']} median x{worst['median_ratio']:.3f}")
    if len(unsure):
        worst = unsure.iloc[0]
        print(f"{len(unsure)} benchmark(s) over the {args.fail_on_regression:g}% limit with one "
              f"save on a side, so noise cannot be ruled out: worst {worst['name']} median "
              f"x{worst['median_ratio']:.3f}")
    return 1 if len(bad) or len(unsure) else 0


def run_interleaved(args: argparse.Namespace) -> int:
    import sys

    from simrig.bench import runner as bench
    from simrig.releases.envs import side_for_compare

    a, b = (side_for_compare(spec) for spec in args.interleave)
    table = bench.interleave(a.python, b.python, args.rounds, filter_expr=args.filter,
                             log=lambda line: print(line, file=sys.stderr))
    print(f"A: {a.spec}\nB: {b.spec}  ({args.rounds} interleaved rounds)\n")
    shown = table.assign(**{
        "median A": table["median_a"].map(bench.format_seconds),
        "median B": table["median_b"].map(bench.format_seconds),
        "B/A": table["median_ratio"].map(lambda v: f"{v:.3f}"),
        "95% CI": [f"[{lo:.3f}, {hi:.3f}]" for lo, hi in zip(table["ci_low"], table["ci_high"])]})
    print(bench.markdown_table(shown[["fullname", "median A", "median B", "B/A", "95% CI", "verdict"]]))
    return 0
