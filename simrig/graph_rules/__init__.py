"""Graph rules: what the cudagraph paths must hand the model, padded rows included.

``padding.py`` (cudagraph dispatch and capture: which graph a step replays,
padded counts, padded values of the global batch), ``dummy_batches.py``
(the profile run, the idle DP dummy and the capture dummies, each held to
what it is for), ``padded_attn.py`` (the attention tables' padded shapes,
every dummy's block tables and slot mappings), ``lora_dispatch.py`` (LoRA dispatch
and captures) and ``lora_inputs.py`` (the adapter mapping handed to
``_set_active_loras``, per request and per token). It may import the core step model, the observations,
``findings``, ``ledger`` (the cited rules), ``reference`` and ``partition``
(the PCP dispatch width); never ``vllm``, the adapters' rooms, ``report``,
``campaign`` or ``selftest``.
"""
