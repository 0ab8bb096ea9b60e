"""Many vLLMs side by side: side venvs (``simrig env``) and ``simrig compare``.

    envs.py    --vllm SPEC -> a side venv under .venvs/ (create, list, probe)
    side.py    the worker run inside one side venv (python -m simrig.compare.side)
    stats.py   bootstrap confidence intervals for interleaved timing rounds
    diff.py    the side-by-side tables (finding classes, contract, latency, values)
    driver.py  runs both sides interleaved and writes one report
    saves.py   simrig bench --compare: sets of saved runs, verdicts from the spread between saves
    bench_report.py  its markdown, CSV and HTML

Nothing here imports vllm: each side's vLLM runs in its own process.
"""
