"""Tools: the subcommands that make or inspect material, and the flags commands share.

One module per subcommand: ``record`` and ``import_cmd`` (traces from vLLM's
real scheduler), ``contract`` (dtype snapshots and their diff), ``bench``,
``history``, ``coverage``, ``doctor`` and ``env``; each defines
``register(subparsers)``. ``common.py`` holds the flags every report-writing
command shares and the history record each appends. The dispatch and the
subcommands that run and judge vLLM are in ``simrig.commands``, one floor up.
Tools may import everything below them; never ``commands``, ``selftest`` or
``cli``.
"""
