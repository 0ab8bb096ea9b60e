"""``simrig repro``: a finding class as one standalone pytest file for vLLM's own tests.

    pytest_file.py  a trace and its class -> the literals of the file, written
                    and (optionally) run under a side venv's interpreter
    template.py     the file's fixed part, as text: it imports only vLLM,
                    torch, numpy, pytest and the standard library
    cpu_runner.py   its helper section (text): GPUModelRunner on CPU, no model
    drive.py        its drive helpers (text): execute_model per step, the dummy paths
    upstream.py     a folder ready for vLLM: the file, ISSUE.md, expected verdicts
    impact.py       what a vLLM user sees of each upstream finding; [Bug] or [Misc]

May import the core, trace_io (the trace reader), reference (the dtype contract)
and ``simrig.bisect.search`` (ClassKey, the class a file asserts). The
template's vLLM imports are text, never executed here: nothing in this package
imports vllm, the adapters, ``releases``, ``campaign``, ``selftest`` or ``commands``.
"""
