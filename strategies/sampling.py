"""Strategies for a request's sampling parameters (``simrig.sampling.params.SamplingSpec``).

A drawn spec changes up to three parameter families and leaves the rest at vLLM's
defaults, so it shrinks towards the default spec; each family draws its edges often:

    temperature       0 (greedy), 1, 2, or in [0.01, 2]   (vLLM raises (0, 0.01) to 0.01)
    top_k             0, -1 (whole vocabulary), 1, vocab_size, or 1 .. vocab_size
    top_p, min_p      1 / 0, small, or any in their ranges
    seed              any int64 but -1 (vLLM's "no seed"; the family left out is no seed)
    penalties         presence and frequency in [-2, 2], repetition in (0, 2], defaults often
    logit_bias        1-4 tokens, biases in [-100, 100]
    bad_words         1-3 words of 1-3 tokens, one token often
    min_tokens        with 0-3 stop_token_ids
    logprobs, prompt_logprobs   None, -1 (whole vocabulary) or 0 .. 20
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from simrig.sampling.params import INT32_MAX, INT64_MAX, INT64_MIN, MAX_LOGPROBS, SamplingSpec
from simrig.step import SYNTH_VOCAB_SIZE
from strategies._validate import check_int

FAMILIES = ("temperature", "top_k", "top_p", "min_p", "seed", "penalties", "logit_bias", "bad_words",
            "min_tokens", "logprobs", "prompt_logprobs")


def _floats(low: float, high: float, *edges: float) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(edges), st.floats(low, high, allow_nan=False, allow_infinity=False))


def _logprobs() -> st.SearchStrategy[int | None]:
    return st.one_of(st.sampled_from((None, -1, 0, 1, MAX_LOGPROBS)), st.integers(0, MAX_LOGPROBS))


def _families(vocab_size: int) -> dict[str, st.SearchStrategy[dict]]:
    """Each family's strategy for the fields it sets."""
    token = st.integers(0, vocab_size - 1)
    return {
        "temperature": _floats(0.01, 2.0, 0.0, 1.0, 2.0).map(lambda t: {"temperature": t}),
        "top_k": st.one_of(st.sampled_from((0, -1, 1, vocab_size)), st.integers(1, vocab_size))
        .map(lambda k: {"top_k": k}),
        "top_p": _floats(1e-3, 1.0, 1.0, 0.1).map(lambda p: {"top_p": p}),
        "min_p": _floats(0.0, 1.0, 0.0, 0.05, 1.0).map(lambda p: {"min_p": p}),
        "seed": st.integers(INT64_MIN, INT64_MAX).filter(lambda s: s != -1).map(lambda s: {"seed": s}),
        "penalties": st.fixed_dictionaries({
            "presence_penalty": _floats(-2.0, 2.0, 0.0, -2.0, 2.0),
            "frequency_penalty": _floats(-2.0, 2.0, 0.0, -2.0, 2.0),
            "repetition_penalty": _floats(0.05, 2.0, 1.0, 2.0)}),
        "logit_bias": st.dictionaries(token, _floats(-100.0, 100.0, -100.0, 100.0), min_size=1, max_size=4)
        .map(lambda d: {"logit_bias": tuple(sorted(d.items()))}),
        # a one-token word masks its token on every row, whatever came before: a slot that
        # keeps it shows on the next request's rows (a longer word needs its prefix first)
        "bad_words": st.lists(st.one_of(token.map(lambda t: (t,)), st.lists(token, min_size=1, max_size=3)
                                        .map(tuple)), min_size=1, max_size=3, unique=True)
        .map(lambda words: {"bad_words": tuple(words)}),
        "min_tokens": st.fixed_dictionaries({
            "min_tokens": st.integers(0, 4),
            "stop_token_ids": st.lists(token, max_size=3, unique=True).map(tuple)}),
        "logprobs": _logprobs().map(lambda n: {"logprobs": n}),
        "prompt_logprobs": _logprobs().map(lambda n: {"prompt_logprobs": n}),
    }


@st.composite
def _sampling_specs(draw, vocab_size: int, max_families: int) -> SamplingSpec:
    families = _families(vocab_size)
    chosen = draw(st.lists(st.sampled_from(FAMILIES), max_size=max_families, unique=True))
    values: dict = {}
    for name in chosen:
        values.update(draw(families[name]))
    return SamplingSpec(**values)


def sampling_specs(*, vocab_size: int = SYNTH_VOCAB_SIZE, max_families: int = 3
                   ) -> st.SearchStrategy[SamplingSpec]:
    """A ``SamplingSpec`` changing up to ``max_families`` of ``FAMILIES`` (the rest at the
    defaults), every token id in ``[0, vocab_size)``; shrinks towards ``SamplingSpec()``.
    Each drawn spec passes ``SamplingSpec.check(vocab_size=vocab_size)``; its
    ``min_tokens`` (at most 4) may still exceed a request's ``max_tokens`` (see
    ``within_max_tokens``)."""
    check_int("vocab_size", vocab_size, minimum=1, maximum=INT32_MAX + 1)
    check_int("max_families", max_families, minimum=0, maximum=len(FAMILIES))
    return _sampling_specs(vocab_size, max_families)


def request_sampling(*, vocab_size: int = SYNTH_VOCAB_SIZE) -> st.SearchStrategy[SamplingSpec | None]:
    """What a new request carries: None (vLLM's defaults) two times in three, else a
    ``sampling_specs`` draw; shrinks towards None."""
    check_int("vocab_size", vocab_size, minimum=1, maximum=INT32_MAX + 1)
    return st.one_of(st.none(), st.none(), _sampling_specs(vocab_size, 3))


def within_max_tokens(spec: SamplingSpec | None, max_tokens: int) -> SamplingSpec | None:
    """``spec`` with ``min_tokens`` lowered to ``max_tokens`` where it is above (vLLM:
    "min_tokens must be less than or equal to max_tokens")."""
    if spec is None or spec.min_tokens <= max_tokens:
        return spec
    return replace(spec, min_tokens=max_tokens)
