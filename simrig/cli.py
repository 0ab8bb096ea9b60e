"""The ``simrig`` console entry point (``simrig``, ``python -m simrig.cli``, ``python -m simrig``).

It only starts ``simrig.commands.dispatch``, which parses the command line,
runs the subcommand and says how every command ends (exit 0, 1, 2, 3 or 130).
The dispatch lives with the commands, below this module, so that a command
that runs other command lines (``simrig demo``) never imports upward.
"""

from __future__ import annotations

import sys

from simrig.commands.dispatch import (  # noqa: F401 -- the entry point's public names
    build_parser,
    main,
    quiet_vllm_logs,
)

if __name__ == "__main__":
    sys.exit(main())
