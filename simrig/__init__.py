"""simrig: a fuzz and replay rig for vLLM's Model Runner V2, run without a model.

Traces of scheduler steps are replayed through vLLM's real ``GPUModelRunner`` and every
value it hands the forward is judged by an oracle that owes vLLM nothing. The package is
laid out in floors (``simrig.layout.FLOORS``, docs/layout.md); start at docs/index.md.
Importing the package imports nothing else.
"""
