"""The sampling oracle: what vLLM's own sampler computed for each request with sampling
parameters, judged against the reference of ``simrig.sampling.processing`` (each row's
processed logits from the trace, the request's parameters and the tokens it was given),
the sampled token against the row's support, and the token handed to the scheduler against
the one sampled. ``oracle.py`` holds ``SamplingOracle``, which the Checker runs on every
step. An oracle room: it imports plain data only (the step model, observations, findings,
``simrig.sampling``), never ``vllm`` or the adapter.
"""
