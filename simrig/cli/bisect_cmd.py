"""``simrig bisect``: which vLLM release or commit introduced (or fixed) a finding class.

The search, the report and the history row are ``simrig.bisect.run.bisect_command``'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simrig.cli.flags import add_output_flags
from simrig.errors import UsageError

DESCRIPTION = """Replay REPRODUCER (a trace) on vLLM releases (side venvs) or on the commits of
    a vLLM checkout (--repo; each commit's MRV2 files laid over the closest installed
    release, nothing built) and binary-search the first point where the finding class
    appears (--good older than --bad) or disappears (--bad older than --good). Points that
    cannot be judged are skipped, as git bisect skip does. Writes a report with each step's
    verdict and time and the MRV2 files that changed, and records the result in simrig
    history."""
EPILOG = """exit status: 0 every leg named its release or commit; 1 a leg is ambiguous (only
    skipped points were left between the last good and the first bad); 2 bad input: an
    unknown spec, a malformed --class, a trace that does not exist or declares no class, a
    --repo that is not git, an end of the range without the verdict its flag claims (one
    line on stderr, no report); 3 simrig's own code raised"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bisect", description=DESCRIPTION, epilog=EPILOG,
                       help="find the vLLM release or commit that introduced (or fixed) a finding class")
    p.add_argument("reproducer", metavar="REPRODUCER", help="a trace file (e.g. a shrunk or "
                   "regression trace) that shows the class on --bad")
    p.add_argument("--good", action="append", required=True, metavar="SPEC",
                   help="a point without the class: a release X.Y.Z (side venv), 'installed', a "
                        "venv path, or with --repo a commit; give twice (older and newer than "
                        "--bad) to find both where it was introduced and where it was fixed")
    p.add_argument("--bad", required=True, metavar="SPEC", help="a point that shows the class")
    p.add_argument("--class", dest="cls", metavar="KIND:STAGE:FIELD[:EXC]",
                   help="the finding class (default: the one the trace header declares, in "
                        "expect or source.signature)")
    p.add_argument("--repo", metavar="PATH", help="a vLLM git checkout: --good/--bad are commits")
    p.add_argument("--base", metavar="SPEC",
                   help="with --repo: the installed release every commit is laid over (default: "
                        "the closest release with a side venv, else the installed vLLM)")
    p.add_argument("--paths", metavar="P,P", default=None,
                   help="with --repo: paths taken from the commit (default vllm/v1/worker/gpu)")
    p.add_argument("--stages", metavar="S,S", default=None,
                   help="replay stages (default: what the class's stage needs)")
    p.add_argument("--cache", metavar="DIR", default=".cache/bisect",
                   help="per-commit overlays and verdicts (default .cache/bisect)")
    p.add_argument("--no-cache", action="store_true", help="judge every point again")
    p.add_argument("--timeout", type=float, default=900, metavar="S",
                   help="seconds one point may take before it is skipped (default 900)")
    add_output_flags(p, "bisect")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # cold path: the bisect's report and the replay bring pandas, off `simrig --help`
    from simrig.bisect import gitrepo, run as bisect_run
    from simrig.bisect.search import ClassKey  # cold path (see above)
    from simrig.replay import parse_stages, scan_trace  # cold path (see above)
    from simrig.report.writer import check_out_dir, default_out_dir  # cold path (see above)
    from simrig.vllm_runtime.overlay import parse_paths  # cold path (see above)

    trace = Path(args.reproducer)
    if not trace.is_file():
        raise UsageError(f"REPRODUCER {args.reproducer}: no such trace file")
    header, _ = scan_trace(trace)
    key = ClassKey.parse(args.cls) if args.cls else ClassKey.from_header(header, str(trace))
    if args.stages:
        parse_stages(args.stages)
    try:
        paths = parse_paths(args.paths)
    except ValueError as exc:
        raise UsageError(f"--paths: {exc}") from None
    if args.timeout <= 0:
        raise UsageError(f"--timeout: must be > 0, got {args.timeout}")
    repo = gitrepo.check_repo(args.repo) if args.repo else None
    if repo is None and (args.base or args.paths):
        raise UsageError(f"{'--base' if args.base else '--paths'}: only with --repo (commits)")
    out = check_out_dir(args.out if args.out else default_out_dir("bisect"))
    log = (lambda line: None) if (args.quiet or args.json) else \
        (lambda line: print(line, file=sys.stderr, flush=True))
    return bisect_run.bisect_command(trace, key, good=args.good, bad=args.bad, repo=repo, base=args.base,
                                     paths=paths, out=out, json_out=args.json, log=log, stages=args.stages,
                                     cache=Path(args.cache), use_cache=not args.no_cache,
                                     timeout=args.timeout)
