"""``simrig repro``: a finding class as one standalone pytest file (no simrig inside).

The file, its check and the upstream folder are ``simrig.repro``'s; the side venvs a
check runs in are ``simrig.releases.envs``'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simrig.errors import UsageError

DESCRIPTION = """Write one pytest file that imports only vLLM, torch and numpy, builds the
    minimal runner state, replays the reproducer's steps as SchedulerOutputs through the
    real Model Runner V2 input path and asserts the property the class violates (e.g.
    "make_dummy's logits_indices is torch.int32, prepare_inputs' is torch.int64"). It fails
    on a vLLM that shows the class and passes where it is fixed: paste it into vLLM's tests
    with the fix."""
EPILOG = """exit status: 0 the file was written (with --check: and the class shows on that
    vLLM: the file fails there, or for a loud rejection it passes; with --check FOLDER:
    every release's verdict is the expected one); 1 with --check: the class does not show
    on that vLLM (FOLDER: a verdict differs from verdict.json's expected); 2 bad input: a
    malformed class, a trace that does not exist or declares no class, a report without the
    class, a kind or stage without a standalone property, an output file that cannot be
    written (one line on stderr)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", description=DESCRIPTION, epilog=EPILOG,
                       help="write a standalone pytest file that reproduces a finding class")
    p.add_argument("target", metavar="CLASS_OR_TRACE",
                   help="a trace (shrunk or regression; its header names the class), or a class "
                        "kind:stage:field[:exception_type] with --trace or --report; with --check "
                        "alone, a reports/upstream/ folder (or its test file)")
    p.add_argument("--pytest", metavar="OUT.py", help="the file to write")
    p.add_argument("--upstream", metavar="DIR",
                   help="write a folder ready for vLLM instead: test_<DIR>.py, ISSUE.md (what, where, "
                        "evidence, the schedule as a table, a suggested fix), trace.jsonl and "
                        "verdict.json (expected verdict per release, from the known findings)")
    p.add_argument("--class", dest="cls", metavar="KIND:STAGE:FIELD[:EXC]",
                   help="with a trace: the class (default: the one its header declares)")
    p.add_argument("--trace", metavar="FILE", help="with a class: the trace that shows it")
    p.add_argument("--report", metavar="DIR",
                   help="with a class: a replay or fuzz report whose classes.csv names its reproducer")
    p.add_argument("--check", action="store_true",
                   help="run the written file with pytest under --vllm and say whether it fails there; "
                        "on a folder: run it on every release with a side venv ($SIMRIG_VENVS) and "
                        "compare with verdict.json")
    p.add_argument("--vllm", metavar="SPEC", default="installed",
                   help="with --check: the vLLM to run it on (a release with a side venv, a venv, "
                        "'installed'; default installed)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # cold path: the side venvs and the report writer bring pandas, off `simrig --help`
    from simrig.releases import envs
    from simrig.report.writer import check_out_file  # cold path (see above)
    from simrig.repro import pytest_file as repro, upstream  # cold path (see above)

    target = Path(args.target)
    if args.check and not args.pytest and not args.upstream:
        folder = target if target.is_dir() else target.parent
        if not (folder / "verdict.json").is_file():
            raise UsageError(f"--check {args.target}: not a folder with verdict.json "
                             "(or give --pytest OUT.py to write and check one file)")
        return _check_folder(folder)
    if args.cls and not target.is_file():
        raise UsageError("--class: only with a trace (a class given as CLASS_OR_TRACE names itself)")
    if bool(args.pytest) == bool(args.upstream):
        raise UsageError("give one of --pytest OUT.py or --upstream DIR")
    trace, key = repro.resolve_input(args.target, args.cls, args.trace, args.report)
    text = repro.render(trace, key)
    if args.upstream:
        test = upstream.write_folder(Path(args.upstream), trace, key, text)
        print(f"wrote {test.parent}/: {test.name}, ISSUE.md, verdict.json, trace.jsonl ({key.text})")
        return _check_folder(test.parent) if args.check else 0
    out = check_out_file(args.pytest, "--pytest")
    if not out.name.endswith(".py"):
        raise UsageError(f"--pytest {args.pytest}: must end in .py")
    side = envs.side_for_compare(args.vllm) if args.check else None
    return repro.write_and_check(out, trace, key, text, side.python if side else None, f"vLLM {args.vllm}")


def _check_folder(folder: Path) -> int:
    """The folder's test on every release with an interpreter: the verdict per release."""
    # cold path: the side venvs and the repro files, off `simrig --help`
    from simrig.releases import envs
    from simrig.repro import pytest_file, upstream  # cold path (see above)

    upstream.read_verdict(folder)  # a bad folder is one line, before any run
    pythons = {}
    for release in upstream.RELEASES:
        try:
            pythons[release] = envs.side_for_compare(release).python
        except UsageError:  # no side venv for it: reported as not run
            continue
    return upstream.print_folder_check(folder, pythons, pytest_file.run_pytest)
