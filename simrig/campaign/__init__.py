"""Campaigns: Hypothesis plays the scheduler against the real runner.

Time-boxed fuzz campaigns over the stateful machine in ``strategies``,
shrinking each finding class to a v1 trace that replays to it, and the pytest
plugin that gives other suites the same harness and checks. Campaign code may
import the core, ``trace_io``, ``findings``, ``checks``, ``report`` and ``strategies``;
``vllm`` only through the adapters.
"""
