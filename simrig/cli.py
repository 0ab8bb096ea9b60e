"""``simrig`` console entry point.

Every command ends in one of four ways: exit 0 (clean), 1 (findings), 2
with one line on stderr naming what was wrong (usage, bad input, unusable
vLLM) and no traceback, or 3 (replay, fuzz, selftest) when simrig's own code
raised: each such exception is a ``rig_error`` finding with its traceback in
the report, which is still written (``simrig.errors.EXIT_RIG_ERROR``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from simrig.commands import COMMAND_MODULES


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
    return parser




def main(argv: list[str] | None = None) -> int:
    from simrig.adapters.runner import VllmApiError, VllmUnavailable
    from simrig.errors import UsageError
    from simrig.sources.trace import TraceError

    parser = build_parser()
    args = parser.parse_args(argv)
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
