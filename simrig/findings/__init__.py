"""Findings: the Finding record, the known findings of each release, and finding classes.

``findings.py`` (the ``Finding`` record, its kinds, ``guarded`` and
``rig_error``), ``known.py`` (the committed known findings and the releases
each applies to), ``expected.py`` (what a trace header's ``expect`` declares)
and ``classes.py`` (occurrences grouped into classes, each with its verdict:
new, known or expected). Every check, the harness, the reports and the
campaigns read these. It may import ``errors`` only: never ``vllm``, the
adapters' rooms, another room of the oracle, ``report`` or ``campaign``.
"""
