"""``simrig compare``: the same traces under two vLLMs, side by side.

Both sides, the report and the history row are ``simrig.releases.compare_run.compare_command``'s.
"""

from __future__ import annotations

import argparse

from simrig.errors import UsageError

DESCRIPTION = """Run the same traces (and optionally the same seeded fuzz campaign) under vLLM
    A and vLLM B, each in its own process and venv, and write one side-by-side report. Exit
    1 when B has finding classes A does not, 2 on bad input."""
EPILOG = """exit status: 0 B has no finding class A lacks; 1 B has a finding class A does
    not; 2 bad input: an unknown --vllm spec, a side venv whose vLLM does not import, a
    release without Model Runner V2"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", description=DESCRIPTION, epilog=EPILOG,
                       help="replay the same traces under two vLLMs, side by side")
    p.add_argument("--vllm", action="append", required=True, metavar="SPEC",
                   help="give twice: A then B (a release X.Y.Z with a side venv from "
                        "'simrig env create', a venv path, or 'installed')")
    p.add_argument("traces", nargs="*", default=["traces/samples"], metavar="TRACE",
                   help="trace files or directories (default traces/samples)")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds per side (default 5); the first is a warm-up, "
                        "a verdict needs >= 3 timed rounds")
    p.add_argument("--stages", default=None, help="optional stages, as in simrig replay")
    p.add_argument("--fuzz-budget", type=float, default=0.0, metavar="S",
                   help="also run the same seeded valid-mode campaign for S seconds on each side")
    p.add_argument("--out", default=None, help="report directory (default reports/compare-<UTC time>)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # cold path: the sides' driver, the replay and the report writer bring pandas, off `simrig --help`
    from simrig.releases import compare_run, envs
    from simrig.replay import expand_trace_paths, parse_stages, scan_trace  # cold path (see above)
    from simrig.report.writer import check_out_dir, default_out_dir  # cold path (see above)

    if len(args.vllm) != 2:
        raise UsageError(f"--vllm: give exactly two (A and B), got {len(args.vllm)}")
    if args.rounds < 1:
        raise UsageError(f"--rounds: must be >= 1, got {args.rounds}")
    if args.fuzz_budget < 0:
        raise UsageError(f"--fuzz-budget: must be >= 0, got {args.fuzz_budget}")
    stages = parse_stages(args.stages)
    out = check_out_dir(args.out) if args.out else default_out_dir("compare")
    paths = expand_trace_paths(args.traces)
    for path in paths:  # every trace valid before any vLLM starts
        scan_trace(path)
    a, b = (envs.side_for_compare(spec) for spec in args.vllm)
    for side in (a, b):
        verdict = envs.doctor(side)
        if not verdict.ok:
            raise UsageError(f"--vllm {side.spec}: its vLLM is unusable: {verdict.line}")
    return compare_run.compare_command(a, b, [str(p) for p in paths], stages=stages, rounds=args.rounds,
                                       fuzz_budget=args.fuzz_budget, out=out)
