"""``simrig repro``: a finding class as one standalone pytest file (no simrig inside)."""

from __future__ import annotations

import argparse

EPILOG = ("exit status: 0 the file was written (with --check: and the class shows on that vLLM: "
          "the file fails there, or for a loud rejection it passes; with --check FOLDER: every "
          "release's verdict is the expected one); 1 with --check: the class does "
          "not show on that vLLM (FOLDER: a verdict differs from verdict.json's expected); 2 bad input: a malformed class, a trace that does not exist or declares no "
          "class, a report without the class, a kind or stage without a standalone property, an "
          "output file that cannot be written (one line on stderr)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "repro", help="write a standalone pytest file that reproduces a finding class",
        description="Write one pytest file that imports only vLLM, torch and numpy, builds the "
                    "minimal runner state, replays the reproducer's steps as SchedulerOutputs "
                    "through the real Model Runner V2 input path and asserts the property the "
                    "class violates (e.g. \"make_dummy's logits_indices is torch.int32, "
                    "prepare_inputs' is torch.int64\"). It fails on a vLLM that shows the class "
                    "and passes where it is fixed: paste it into vLLM's tests with the fix.",
        epilog=EPILOG)
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
    import os
    import tempfile
    from pathlib import Path

    from simrig.errors import UsageError
    from simrig.releases import envs
    from simrig.report.writer import check_out_file
    from simrig.repro import pytest_file as repro

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
        from simrig.repro import upstream

        test = upstream.write_folder(Path(args.upstream), trace, key, text)
        print(f"wrote {test.parent}/: {test.name}, ISSUE.md, verdict.json, trace.jsonl ({key.text})")
        return _check_folder(test.parent) if args.check else 0
    out = check_out_file(args.pytest, "--pytest")
    if not out.name.endswith(".py"):
        raise UsageError(f"--pytest {args.pytest}: must end in .py")
    side = envs.side_for_compare(args.vllm) if args.check else None
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{out.name}-", dir=out.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, out)
    print(f"wrote {out}: {key.text} from {trace} ({len(text.splitlines())} lines); "
          f"run: pytest -q {out}")
    if side is None:
        return 0
    status, tail = repro.run_pytest(side.python, out.resolve())
    where = f"vLLM {args.vllm}"
    if status not in (0, 1):
        raise UsageError(f"--check: pytest could not run the file on {where} (exit {status}): "
                         f"{tail.splitlines()[-1] if tail else ''}")
    # a loud rejection shows when its file passes; a silent acceptance when it fails
    loud = (repro.class_literal(key, repro.read_trace(trace)[0])["property"] == "raises"
            and key.kind != "silent_acceptance")
    shows = (status == 1) != loud  # a loud rejection shows when its test passes
    verb = "passes" if status == 0 else "FAILS"
    what = (f"it reproduces {key.text}" if shows and not loud else
            f"the runner rejects the violation loudly ({key.text} shows)" if shows else
            f"the violation is accepted silently ({key.text} does not show)" if loud else
            f"{key.text} does not show there")
    print(f"check: {verb} on {where}: {what}")
    for line in tail.splitlines()[:1] if status == 1 else []:
        print(f"  {line.removeprefix('E').strip()}")
    return 0 if shows else 1


def _check_folder(folder: "Path") -> int:
    """The folder's test on every release with an interpreter: the verdict per release."""
    from simrig.errors import UsageError
    from simrig.releases import envs
    from simrig.repro import pytest_file, upstream

    upstream.read_verdict(folder)  # a bad folder is one line, before any run
    pythons = {}
    for release in upstream.RELEASES:
        try:
            pythons[release] = envs.side_for_compare(release).python
        except UsageError:  # no side venv for it: reported as not run
            continue
    measured, ok = upstream.check_folder(folder, pythons, pytest_file.run_pytest)
    expected = upstream.read_verdict(folder)["expected"]
    for release in upstream.RELEASES:
        got = measured.get(release, "not run (no side venv)")
        mark = "" if release not in measured else "  ok" if got == expected[release] else "  DIFFERS"
        print(f"{folder.name}: vLLM {release}: {got} (expected {expected[release]}){mark}")
    return 0 if ok else 1
