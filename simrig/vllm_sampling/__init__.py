"""vLLM's own sampler, driven with each request's sampling parameters: ``sampling_params.py`` maps a
trace's ``SamplingSpec`` onto the installed ``SamplingParams``; ``switch.py`` builds the
release's ``Sampler`` as the runner does and puts it behind ``runner.sampler``, keeping
every request's sampling state in vLLM's own slot tables and sampling each batch that
holds a request with parameters, and observes what it computed (the processed logits and
the sampled tokens) by wrapping it. A vLLM room: it may import ``vllm``, the rooms below it
(``vllm_runtime``, ``vllm_api``) and the plain-data ``simrig.sampling``; never the oracle.
"""
