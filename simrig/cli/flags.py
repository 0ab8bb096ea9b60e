"""Flags every report-writing command shares, with one meaning everywhere.

    --out DIR            the report directory
    --progress MODE      tty | plain | quiet (default: tty on a terminal, else plain)
    --quiet              same as --progress quiet
    --json               print summary.json on stdout (nothing else there), for scripts
    --memcheck           the kernel memory checker (replay, fuzz; selftest: on, --no-memcheck)
    --step-timeout S     a supervised worker that opens no stage for S seconds hangs (replay, fuzz)
    --summary-md FILE    a few Markdown lines for a CI job page (replay, fuzz, selftest)
    --verbose            show vLLM's own import messages (added to every command by simrig.cli.dispatch)

and the history record each of them appends (simrig.history.store).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

EXIT_STATUSES = ("exit status: 0 nothing new; 1 a new finding class (or a surviving mutant); "
                 "2 bad arguments or input (one line on stderr, no report)")


def add_output_flags(p: argparse.ArgumentParser, kind: str, *, out_default: str | None = None) -> None:
    p.add_argument("--out", default=out_default, metavar="DIR",
                   help=f"report directory (default: {out_default or f'reports/{kind}-<UTC time>'})")
    p.add_argument("--progress", choices=("tty", "plain", "quiet"), default=None,
                   help="progress on stderr (default: tty on a terminal, else plain)")
    p.add_argument("--quiet", action="store_true", help="same as --progress quiet")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON on stdout (the human lines are not printed)")


def add_summary_md_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--summary-md", default=None, metavar="FILE",
                   help="also write a short Markdown summary (verdict, new classes with their "
                        "reproducers, changes since the previous run of the suite) to FILE, for a "
                        "CI job page (e.g. cat FILE >> $GITHUB_STEP_SUMMARY)")


def check_summary_md(args: argparse.Namespace) -> None:
    """Refuse an unwritable --summary-md before the run (exit 2)."""
    if getattr(args, "summary_md", None):
        from simrig.report.writer import check_out_file

        check_out_file(args.summary_md, "--summary-md")


def write_summary_md(args: argparse.Namespace, command: str, summary: dict[str, Any], classes: Any,
                     headline: str, report: str) -> None:
    """--summary-md FILE: the run's Markdown summary, written whole (temporary file, rename)."""
    path = getattr(args, "summary_md", None)
    if not path:
        return
    import tempfile
    from pathlib import Path

    from simrig.report.html import banner
    from simrig.views.summary_md import summary_markdown

    text = summary_markdown(command, banner(summary)[0], headline, summary, classes, report)
    target = Path(path)
    target.absolute().parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{target.name}-", dir=target.absolute().parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, target)


def changes_line(summary: dict[str, Any]) -> str:
    """'since the previous run: ...' for the terminal ('' when the summary has no changes)."""
    from simrig.views.changes import change_lines

    lines = change_lines(summary.get("since_previous"))
    return "since the previous run: " + "; ".join(lines) if lines else ""


def add_memcheck_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memcheck", action="store_true",
                   help="check every load and store of MRV2's interpreted kernels against the "
                        "tensors the launch was handed (CPU mode; about 1.05-1.25x the time): an "
                        "out-of-bounds access is a KernelMemoryError finding naming kernel, "
                        "argument, index and bounds (same as SIMRIG_MEMCHECK=1)")


def add_step_timeout_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step-timeout", type=float, default=None, metavar="SECONDS",
                   help="the run's worker process opens a stage of vLLM's code at least this often, "
                        "or it hangs: it is killed and what it ran becomes a crash class "
                        "(default 600)")


def check_step_timeout(args: argparse.Namespace) -> None:
    from simrig.errors import UsageError

    if getattr(args, "step_timeout", None) is not None and args.step_timeout <= 0:
        raise UsageError(f"--step-timeout: must be > 0 seconds, got {args.step_timeout}")


@contextlib.contextmanager
def memcheck_env(on: bool) -> Iterator[None]:
    """With ``on`` (--memcheck): SIMRIG_MEMCHECK=1 while the command runs, set before vLLM is
    imported, so this process and every worker or child it starts installs the checker
    (``simrig.vllm_runtime.platform``); the environment is put back after (an in-process
    caller's later runs are not checked). Off: the environment is left as it is."""
    before = os.environ.get("SIMRIG_MEMCHECK")
    if on:
        os.environ["SIMRIG_MEMCHECK"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SIMRIG_MEMCHECK", None)
        else:
            os.environ["SIMRIG_MEMCHECK"] = before


def progress_mode(args: argparse.Namespace) -> str | None:
    """The --progress mode; --quiet means quiet. (Progress is on stderr, so --json,
    which owns stdout, leaves it alone.)"""
    if getattr(args, "quiet", False):
        return "quiet"
    mode = getattr(args, "progress", None)
    if mode is None and not sys.stderr.isatty():
        return "plain"
    return mode


def emit_json(summary: dict[str, Any]) -> None:
    from simrig.report.html import jsonable

    sys.stdout.write(json.dumps(jsonable(summary), indent=2, sort_keys=True) + "\n")


def record_history(summary: dict[str, Any], classes: Any) -> None:
    """Append this run to the history store. The run's result is already decided:
    a store that cannot be written, any error from it, or a Ctrl-C during the
    append costs one warning line, never the exit status."""
    root = None
    try:
        from simrig.history.store import append_run, history_dir

        root = history_dir()
        if root is None:
            return
        append_run(root, summary, classes)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 -- see above
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else \
            " ".join(str(exc).split()) or type(exc).__name__
        where = root if root is not None else "the history store"
        print(f"simrig: warning: history not recorded in {where}: {why}", file=sys.stderr)


def open_history_store(args: argparse.Namespace) -> Any:
    """The store ``--store`` (or $SIMRIG_HISTORY) names, checked before reading:
    recording on, ``--since`` an ISO date/time, ``runs/`` present (UsageError)."""
    from datetime import datetime
    from pathlib import Path

    from simrig.errors import UsageError
    from simrig.history.store import history_dir

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
    return store
