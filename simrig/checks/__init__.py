"""Checks: what an observation of the real code must satisfy.

The Checker (all checks behind one object), the independent reference model,
dummy/real parity, PCP partition invariants, the scheduler contract and
loudness rules, the dtype contract and drift, known findings and the Finding
record itself. Checks read Steps and observations (plain data) only: they
never import ``vllm`` or the adapters, and never ``campaign``, ``selftest``
or ``report``.
"""
