"""Commands: the dispatch of one ``simrig`` command line, and the subcommands that run and judge vLLM.

``dispatch.py`` parses a command line, runs its subcommand and ends it with
its exit status; ``demo``, ``replay``, ``fuzz``, ``selftest``, ``compare``,
``bisect`` and ``repro`` are here, one module each. The subcommands that
make or inspect material (``record``, ``import``, ``contract``, ``bench``,
``history``, ``coverage``, ``doctor``, ``env``) are in ``simrig.tools``, one
floor below. Each subcommand module defines ``register(subparsers)``, which
adds its parser and sets ``func`` (``args -> exit status``) as the parser
default. Commands may import everything below them; only ``cli`` imports
them, and only the ``selftest`` command imports ``simrig.selftest``.
"""

# The order in which subcommands appear in ``simrig --help``: each one's module.
COMMAND_MODULES = ("simrig.commands.demo", "simrig.commands.replay", "simrig.commands.fuzz",
                   "simrig.tools.record", "simrig.tools.import_cmd", "simrig.tools.contract",
                   "simrig.tools.bench", "simrig.commands.selftest", "simrig.tools.history",
                   "simrig.tools.coverage", "simrig.tools.doctor", "simrig.tools.env",
                   "simrig.commands.compare", "simrig.commands.bisect", "simrig.commands.repro")
