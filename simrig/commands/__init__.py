"""One module per ``simrig`` subcommand.

Each module defines ``register(subparsers)``, which adds its parser and sets
``func`` (``args -> exit status``) as the parser default.
"""

# The order in which subcommands appear in ``simrig --help``.
COMMAND_MODULES = ("demo", "replay", "fuzz", "record", "import_cmd", "contract",
                   "bench", "selftest", "history", "coverage", "doctor", "env", "compare",
                   "bisect", "repro")
