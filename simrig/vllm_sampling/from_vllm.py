"""The installed vLLM's ``SamplingParams`` as a trace's ``SamplingSpec``: the inverse of
``sampling_params.py``, for the recorders (``simrig record``, the live hook).

Bad words are read as token ids (``bad_words_token_ids``). Stop ids the caller names (the
recorder's own stop id, its synthetic model's way of ending a request) are left out. A field
a trace cannot hold (a token id past its vocabulary, a value past a bound of
``simrig.sampling.params``) goes back to its default, so every spec written reads back; and
a request asking for nothing beyond vLLM's defaults gives None: nothing is written.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import fields, replace
from typing import Any

from simrig.sampling.params import SamplingSpec, SamplingSpecError

_DEFAULTS = {f.name: f.default for f in fields(SamplingSpec)}


def sampling_spec(params: Any, *, drop_stop_ids: Collection[int] = ()) -> SamplingSpec | None:
    """``params`` field by field (None for a request without any: a pooling request, or
    vLLM's defaults)."""
    if params is None:
        return None
    spec = SamplingSpec(
        temperature=float(params.temperature), top_k=int(params.top_k), top_p=float(params.top_p),
        min_p=float(params.min_p), seed=params.seed, presence_penalty=float(params.presence_penalty),
        frequency_penalty=float(params.frequency_penalty),
        repetition_penalty=float(params.repetition_penalty),
        logit_bias=tuple(sorted((int(t), float(b)) for t, b in (params.logit_bias or {}).items())),
        bad_words=tuple(tuple(word) for word in params.bad_words_token_ids or ()),
        min_tokens=int(params.min_tokens),
        stop_token_ids=tuple(t for t in params.stop_token_ids or () if t not in drop_stop_ids),
        logprobs=params.logprobs, prompt_logprobs=params.prompt_logprobs)
    return None if spec.is_default else spec


def recorded_spec(params: Any, *, vocab_size: int, drop_stop_ids: Collection[int] = ()
                  ) -> SamplingSpec | None:
    """``sampling_spec``, each field a trace of ``vocab_size`` tokens cannot hold set back to
    its default (None when nothing is left)."""
    spec = sampling_spec(params, drop_stop_ids=drop_stop_ids)
    for _ in _DEFAULTS:  # each round sets one field back: at most every field once
        if spec is None or spec.is_default:
            return None
        try:
            spec.check(vocab_size=vocab_size, max_tokens=getattr(params, "max_tokens", None))
            return spec
        except SamplingSpecError as exc:  # "sampling.<field>[...]": the field named first
            name = exc.field.split(".")[1].split("[")[0]
            spec = replace(spec, **{name: _DEFAULTS[name]})
    return None
