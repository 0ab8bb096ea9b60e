"""Checks: every check of a step behind one object, and the checks of the step as a whole.

``checker.py`` (the ``Checker``: one step's observation in, its findings out,
marked known or not) runs the checks of every room of the oracle;
``lifecycle.py`` (the scheduler contract, loudness, exceptions on valid input),
``parity.py`` (a dummy batch is the real batch's twin) and ``fields.py`` (value
expectations beyond the reference model; the runner's live set and free
slots) are its own. The oracle's other rooms sit below it: ``findings``,
``ledger``, ``reference``, ``partition``, ``graph_rules``. Checks read Steps
and observations (plain data) only: they may import the core step model, the
observations and those rooms, never ``vllm`` or the adapters' rooms, and never
``campaign``, ``selftest``, ``report`` or ``harness``.
"""
