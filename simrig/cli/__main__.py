"""``python -m simrig.cli``: the ``simrig`` command line."""

import sys

from simrig.cli.dispatch import main

sys.exit(main())
