"""A request's sampling parameters as plain data: ``params.py`` holds ``SamplingSpec``
(temperature, top-k/top-p/min-p, seed, penalties, logit bias, bad words, min tokens with
stop token ids, logprobs), its bounds and its JSON form, which the trace format's optional
``sampling`` object of a new request reads and writes (traces/README.md). It stands on the
lowest floor: the step model imports it, so it may import only the standard library and
numpy, never another room or module of simrig (and never ``vllm``: the vLLM side maps a
spec onto ``SamplingParams``).
"""
