"""History: every recorded run and its finding classes, and the page of their trends.

``store.py`` (the parquet history store: one file per run per table, runs,
classes, coverage; ``record_history``, the row every run appends), ``changes.py``
(what changed since the previous run) and ``page.py`` (the ``simrig history`` page:
trends and one line per finding class). It may import the core, ``coverage``,
``findings`` (finding classes), ``views`` and ``report`` (the page's parts), never
``vllm`` or the adapters' rooms, the harness, ``campaign``, ``selftest`` or
the command line (``cli``).
"""
