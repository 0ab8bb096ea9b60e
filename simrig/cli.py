"""``simrig`` console entry point.

Every command ends in one of four ways: exit 0 (clean), 1 (findings), 2
with one line on stderr naming what was wrong (usage, bad input, unusable
vLLM) and no traceback, or 3 (replay, fuzz, selftest) when simrig's own code
raised: each such exception is a ``rig_error`` finding with its traceback in
the report, which is still written (``simrig.errors.EXIT_RIG_ERROR``).

vLLM's own import messages on CPU (``Failed to import from vllm._C…``, the
pinned-memory note) say nothing about the runner's input path; they are kept
out of the way (vLLM's log level ERROR) unless ``--verbose`` is given or
``VLLM_LOGGING_LEVEL`` is already set.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from simrig.commands import COMMAND_MODULES

# Exit statuses of commands whose own module states them in its description only.
DEFAULT_EPILOGS = {
    "record": "exit status: 0 trace written; 2 bad arguments, a bad workload file or unusable vLLM",
    "import": "exit status: 0 trace written; 2 bad arguments or a bad workload line (FILE:LINE)",
    "bench": "exit status: 0 fine; 1 a benchmark failed or a ratio exceeded "
             "--fail-on-regression; 2 bad input (unknown run, malformed JSON, empty filter)",
    "contract": "exit status: snapshot 0 written; diff 0 equal, 1 different; 2 bad input",
    "doctor": "exit status: 0 every entry point usable; 2 otherwise",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simrig",
        description="Replay and fuzz scheduler outputs through vLLM's real Model Runner V2 input path.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"simrig.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"simrig.commands.{name}":
                continue  # command not shipped in this build
            raise
        module.register(sub)
    for name, command in sub.choices.items():  # one meaning everywhere
        if not command.epilog and name in DEFAULT_EPILOGS:
            command.epilog = DEFAULT_EPILOGS[name]
        command.add_argument("--verbose", action="store_true",
                             help="show vLLM's own log messages (import notes on CPU included)")
    return parser


def quiet_vllm_logs(verbose: bool) -> None:
    """Before vLLM is imported: its log level ERROR unless asked for (see module docstring)."""
    if verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # The import notes can fire before vLLM configures its own handlers (they then
    # reach Python's last-resort handler); the level on the "vllm" logger holds either way.
    logging.getLogger("vllm").setLevel(logging.ERROR)



def main(argv: list[str] | None = None) -> int:
    from simrig.adapters.runner import VllmApiError, VllmUnavailable
    from simrig.errors import UsageError
    from simrig.sources.trace import TraceError

    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_vllm_logs(getattr(args, "verbose", False))
    try:
        return int(args.func(args) or 0)
    except (UsageError, TraceError, VllmApiError, VllmUnavailable) as exc:
        print(f"simrig {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"simrig {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
