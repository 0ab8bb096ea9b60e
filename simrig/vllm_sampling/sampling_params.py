"""A trace's ``SamplingSpec`` as the installed vLLM's ``SamplingParams``.

Every field keeps its name and meaning; bad words, which a trace states as token ids,
go where ``SamplingParams.update_from_tokenizer`` puts the words it tokenizes
(``_bad_words_token_ids``, read through ``bad_words_token_ids``), since the rig has no
tokenizer.
"""

from __future__ import annotations

from typing import Any

from simrig.sampling.params import SamplingSpec


def sampling_params(params_class: Any, spec: SamplingSpec | None, max_tokens: int) -> Any:
    """``SamplingParams`` for a request: vLLM's defaults where ``spec`` is None."""
    if spec is None:
        return params_class(max_tokens=max_tokens)
    params = params_class(
        max_tokens=max_tokens, temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p,
        min_p=spec.min_p, seed=spec.seed, presence_penalty=spec.presence_penalty,
        frequency_penalty=spec.frequency_penalty, repetition_penalty=spec.repetition_penalty,
        logit_bias=dict(spec.logit_bias) or None, min_tokens=spec.min_tokens,
        stop_token_ids=list(spec.stop_token_ids), logprobs=spec.logprobs,
        prompt_logprobs=spec.prompt_logprobs)
    if spec.bad_words:
        params._bad_words_token_ids = [list(word) for word in spec.bad_words]
    return params
