"""The command line: every ``simrig`` subcommand's parser, and the dispatch that runs one.

``dispatch.py`` parses a command line, runs its subcommand and ends it with its
exit status (``main`` is the console entry point ``simrig``; ``python -m
simrig.cli`` and ``python -m simrig`` start it too). ``flags.py`` holds the flags
commands share. Each ``<command>_cmd.py`` defines ``register(subparsers)``: it adds
its parser, checks its arguments and calls into the room that does the work
(``simrig.replay``, ``simrig.campaign``, ``simrig.selftest``, ...). It may import
every room below it; nothing in simrig imports it but ``simrig.__main__``, and
only ``selftest_cmd.py`` imports ``simrig.selftest``.
"""

from simrig.cli.dispatch import (  # noqa: F401 -- the entry point's public names
    build_parser,
    main,
    quiet_vllm_logs,
)
