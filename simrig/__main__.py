"""``python -m simrig``: the same console entry point as ``simrig`` (``simrig.cli.main``).

See docs/commands.md for the subcommands.
"""

import sys

from simrig.cli import main

sys.exit(main())
