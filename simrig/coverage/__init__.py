"""Coverage of the real MRV2 code a run reached, and why the rest is not reached.

``collect`` measures line and branch coverage of the installed vLLM's
``vllm/v1/worker/gpu/`` folder with coverage.py's C tracer (located with
``importlib.util.find_spec``, never by importing vLLM), ``analysis`` turns the
reached arcs into per-file, per-function and never-reached-line tables,
``reasons`` reads the one reviewed list of why a line is never reached
(``unreached.toml``), ``session`` wires it into the commands (flags, one
collector per process, report parts). Steering campaigns by coverage lives in
``simrig.campaign.fuzz`` (it uses ``Collector.take``). It may import the core, ``report`` and
``errors``, coverage.py and pandas; never ``vllm``, the adapters, ``campaign``,
``selftest``, ``distributed`` or ``commands``.
"""
