"""History: every recorded run and its finding classes, and the page of their trends.

``store.py`` (the parquet history store: one file per run per table, runs,
classes, coverage) and ``page.py`` (the ``simrig history`` page: trends and
one line per finding class). It may import the core, ``coverage``,
``findings`` (finding classes) and ``report`` (the page's parts), never
``vllm`` or the adapters' rooms, the harness, ``campaign``, ``selftest`` or
the commands.
"""
