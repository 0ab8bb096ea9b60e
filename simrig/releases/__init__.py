"""Many vLLMs side by side: side venvs (``simrig env``) and ``simrig compare``.

    envs.py         --vllm SPEC -> a side venv under .venvs/ (create, list, probe)
    side.py         the worker run inside one side venv (python -m simrig.releases.side)
    diff.py         the side-by-side tables (finding classes, contract, latency, values)
    compare_run.py  runs both sides interleaved and writes one report
    fuzzsides.py    the same seeded fuzz campaign under each side, its classes compared

May import the core, trace_io, findings, report and ``simrig.bench.stats`` (the
bootstrap intervals of interleaved rounds); the adapters only inside side.py,
lazily, since that worker runs in the side venv. Never ``campaign``,
``selftest``, ``cli``, ``bisect`` or ``repro``. Nothing here imports vllm:
each side's vLLM runs in its own process.
"""
