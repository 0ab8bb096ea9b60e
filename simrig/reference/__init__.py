"""The reference model: what one step's batch must hold, predicted from the Steps alone.

``reference.py`` (the independent reference model: batch order, per-request
and per-token predictions, slots held to their meaning), ``semantics.py`` (a
batch's self-consistency, real or dummy, from its fields' comments),
``contract.py`` (the dtype contract of every stage and step-to-step drift),
``blocks.py`` (block tables and slot mappings from the Steps),
``descriptor.py`` (the cudagraph descriptor's padded counts) and
``comparer.py`` (one stage's fields against predicted values). It may import
the core step model, the observations and ``findings``; never ``vllm``, the
adapters' rooms, ``report``, ``campaign`` or ``selftest``.
"""
