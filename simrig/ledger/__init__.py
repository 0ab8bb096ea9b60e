"""The ledger: what the oracle judges of each observed value, and why it leaves the rest.

``unchecked.py`` (every observed field: value-checked and by which check, or
listed with the reason it is not), ``evidence.py`` (the vLLM lines behind
every such reason and behind the dummy rules, re-read by the tests) and
``decisions.py`` (every value a path of ``execute_model`` hands on, and who
judges it: docs/decisions.md). Pure tables and text: it imports nothing of
simrig, never ``vllm``, the adapters' rooms, another room of the oracle,
``report`` or ``campaign``.
"""
