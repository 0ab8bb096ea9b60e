"""Coverage of the real MRV2 code a run reached, and why the rest is not reached.

``collect`` measures line and branch coverage of the installed vLLM's
``vllm/v1/worker/gpu/`` folder with coverage.py's C tracer (located with
``importlib.util.find_spec``, never by importing vLLM), ``analysis`` turns the
reached arcs into per-file, per-function and never-reached-line tables,
``reasons`` reads the one reviewed list of why a line is never reached
(``unreached.toml``), ``session`` wires it into the commands (flags, one
collector per process, report parts). Steering campaigns by coverage lives in
``simrig.campaign.steering`` (it uses ``Collector.take``); the report renders
the tables (``simrig.report``, above this package). It may import ``errors``,
coverage.py and pandas; never ``report``, ``vllm``, the adapters, ``campaign``,
``selftest``, ``distributed`` or ``cli``.
"""
