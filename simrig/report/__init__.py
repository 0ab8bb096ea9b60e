"""Reports: pandas tables to parquet, CSV and one self-contained HTML page.

The report writer, its plots, the compact append-only row tables used while
a run streams, and contract snapshots (the dtypes the installed vLLM really
produces) with their diff. Report code reads results and findings; it never
imports ``vllm`` or the adapters directly, nor ``campaign`` or ``selftest``.
"""
