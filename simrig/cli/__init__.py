"""The command line: every ``simrig`` subcommand's parser and the dispatch that runs one.

``dispatch.py`` parses a command line, runs its subcommand and ends it with its exit
status (``main``: the console entry point, also ``python -m simrig.cli`` and ``python -m
simrig``); ``flags.py`` holds the flags commands share; each ``<command>_cmd.py`` adds
its parser, checks its arguments and calls into the room that does the work. It may
import every room below it; only ``simrig.__main__`` imports it, and only
``selftest_cmd.py`` imports ``simrig.selftest``.
"""

from simrig.cli.dispatch import (  # noqa: F401 -- the entry point's public names
    build_parser,
    main,
    quiet_vllm_logs,
)
