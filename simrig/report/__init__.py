"""Reports: pandas tables to parquet, CSV and one self-contained HTML page.

The report writer, the page, its plots, what a run keeps of each step (the
recorder and the compact append-only row tables used while a run streams),
where the time goes (timing, the stack profile), contract snapshots (the
dtypes the installed vLLM really produces) with their diff, and the
generated tables of the documentation site. Report code reads results and
findings; it may import the core, ``coverage``, ``findings`` and
``reference`` (the dtype contract), never ``vllm`` or the adapters' rooms,
the harness, ``campaign`` or ``selftest``.
"""
