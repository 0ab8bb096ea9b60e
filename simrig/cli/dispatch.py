"""One ``simrig`` command line: parsed, dispatched to its subcommand, ended with an exit status.

``simrig.cli`` exports ``main``; ``simrig demo`` runs its command lines through it too.
Every command ends with 0 (clean), 1 (findings), 2 (one line naming what was wrong, no
traceback), 3 (simrig's own code raised: ``simrig.errors.EXIT_RIG_ERROR``) or 130
(Ctrl-C, ``simrig.interrupt``). ``quiet_vllm_logs`` keeps vLLM's CPU import messages
out of the way unless ``--verbose`` or ``VLLM_LOGGING_LEVEL`` says otherwise.

See docs/commands.md, 'Errors, Ctrl-C and concurrent runs'.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import tempfile
import traceback

from simrig.cli.flags import scoped_env
from simrig.errors import EXIT_RIG_ERROR, EXIT_USAGE, UsageError, describe_io_error
from simrig.trace_io.trace import TraceError
from simrig.vllm_api.entry_points import VllmApiError, VllmUnavailable

# The order in which subcommands appear in ``simrig --help``: each one's module.
COMMAND_MODULES = tuple(f"simrig.cli.{name}_cmd" for name in (
    "demo", "replay", "fuzz", "record", "import", "contract", "bench", "selftest", "history",
    "coverage", "doctor", "env", "compare", "bisect", "repro"))

# Exit statuses of commands whose own module states them in its description only.
DEFAULT_EPILOGS = {
    "record": "exit status: 0 trace written; 2 bad arguments, a bad workload file or unusable vLLM",
    "import": "exit status: 0 trace written; 2 bad arguments or a bad workload line (FILE:LINE)",
    "bench": "exit status: 0 fine; 1 a benchmark failed or a ratio exceeded "
             "--fail-on-regression; 2 bad input (unknown run, malformed JSON, empty filter)",
    "contract": "exit status: snapshot 0 written; diff 0 equal, 1 different; 2 bad input",
    "doctor": "exit status: 0 every entry point usable; 2 otherwise",
}
# --verbose where it means more than vLLM's log messages.
VERBOSE_HELP = {"history": "list the files the store's reader skipped (temporary, unreadable, "
                           "classes with no run row)"}
# Commands that judge findings against the known-findings files (--known FILE).
JUDGING_COMMANDS = ("demo", "replay", "fuzz", "selftest", "compare")
# Commands that compare runs in the history store: --across-releases sets, for the command and its
# workers, what simrig.history.changes.across_releases() reads
HISTORY_COMMANDS, ACROSS_RELEASES_ENV = ("replay", "fuzz", "selftest", "history"), "SIMRIG_ACROSS_RELEASES"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simrig",
        description="Replay and fuzz scheduler outputs through vLLM's real Model Runner V2 input path.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # command not shipped in this build
            raise
        module.register(sub)
    for name, command in sub.choices.items():  # one meaning everywhere
        if not command.epilog and name in DEFAULT_EPILOGS:
            command.epilog = DEFAULT_EPILOGS[name]
        command.add_argument("--verbose", action="store_true", help=VERBOSE_HELP.get(
            name, "show vLLM's own log messages (import notes on CPU included)"))
        if name in JUDGING_COMMANDS:
            command.add_argument(
                "--known", metavar="FILE", default=None,
                help="known-findings file (or folder of known-findings*.json) to judge against "
                     "(default: reports/baselines/)")
        if name in HISTORY_COMMANDS:
            command.add_argument("--across-releases", action="store_true", help=(
                "compare with runs of the same suite on any vLLM release (default: on this release only)"))
    return parser


def quiet_vllm_logs(verbose: bool) -> None:
    """Before vLLM is imported: its log level ERROR unless asked for (its CPU import
    messages, ``Failed to import from vllm._C...`` and the pinned-memory note, say
    nothing about the input path) by ``--verbose`` or an existing ``VLLM_LOGGING_LEVEL``."""
    if verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # The import notes can fire before vLLM configures its own handlers (they then
    # reach Python's last-resort handler); the level on the "vllm" logger holds either way.
    logging.getLogger("vllm").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_vllm_logs(getattr(args, "verbose", False))
    # --across-releases: for the command and its workers, as it was after
    with scoped_env(ACROSS_RELEASES_ENV, "1" if getattr(args, "across_releases", False) else None):
        return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    """The parsed command run, its end turned into an exit status (one line on stderr)."""
    name = f"simrig {args.command}"
    try:
        if args.command in JUDGING_COMMANDS:
            _choose_known_findings(getattr(args, "known", None))
        return int(args.func(args) or 0)
    except (UsageError, TraceError, VllmApiError, VllmUnavailable) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, UnicodeError) as exc:  # input or output: name the file, not a traceback
        if isinstance(exc, BrokenPipeError):  # `simrig ... | head`
            return EXIT_USAGE
        print(f"{name}: error: {describe_io_error(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 -- a bug in simrig: one line, traceback kept
        saved = _save_traceback(args.command)
        print(f"{name}: internal error (a bug in simrig): {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''} (traceback: {saved})", file=sys.stderr)
        return EXIT_RIG_ERROR


def _choose_known_findings(path: str | None) -> None:
    """--known FILE for this process and its children; every file is read now,
    before vLLM is imported, so a malformed one fails in a second."""
    # cold path: only the judging commands read the known findings, off `simrig --help`
    from simrig.findings.known import KNOWN_ENV, validate_known_findings

    if path:
        os.environ[KNOWN_ENV] = os.path.abspath(path)
    validate_known_findings()


def _save_traceback(command: str) -> str:
    fd, path = tempfile.mkstemp(prefix=f"simrig-{command}-traceback-", suffix=".txt")
    with os.fdopen(fd, "w") as fh:
        fh.write(traceback.format_exc())
    return path

