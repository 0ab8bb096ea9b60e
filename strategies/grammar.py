"""Structured-output requests: how many tokens a request's grammar allows, and which.

An arriving request is structured about one time in eight (never under speculative
decoding, which the trace reader refuses); it then keeps one allowed-set size for its life,
drawn towards the edges:

    1                  a single allowed token (the row's only finite value)
    2 .. 8             a few
    vocab/2 .. vocab-1 most of the vocabulary

Each step it samples, ``strategies.model.SchedulerModel`` names its set with
``allowed_tokens`` (fixed by the request, the position and the size, so a shrunk example
keeps its sets) and lists it in ``Step.grammar`` in the scheduler's order (running requests
first, then new ones), which differs from the batch order the runner sorts by (decodes
first). At least one allowed token is never masked by the request's own bad words or stop
ids, so a row always has a token to sample.
"""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import strategies as st

from simrig.sampling.params import SamplingSpec
from simrig.step import SYNTH_VOCAB_SIZE, RunnerConfig


def grammar_sizes(config: RunnerConfig, vocab_size: int = SYNTH_VOCAB_SIZE) -> st.SearchStrategy[int]:
    """An arriving request's allowed-set size; 0 (not structured) seven times in eight, and
    always under speculative decoding verified by the greedy stand-in (a grammar request's rows
    must be spread, and under drafts only those vLLM's RejectionSampler verifies are; such a
    request is made greedy, ``SchedulerModel.arrive``). Shrinks towards 0."""
    if config.num_speculative_tokens and not config.rejection_sampler:
        return st.just(0)
    sizes = st.one_of(st.just(1), st.integers(2, 8), st.integers(vocab_size // 2, vocab_size - 1))
    return st.one_of(*[st.just(0)] * 7, sizes)


def allowed_tokens(req_id: str, position: int, size: int, spec: SamplingSpec | None,
                   vocab_size: int = SYNTH_VOCAB_SIZE) -> tuple[int, ...]:
    """``size`` distinct token ids, ascending, for ``req_id``'s row after ``position``; the
    first drawn is none of the tokens ``spec``'s bad words end with or its stop ids."""
    rng = np.random.default_rng(zlib.crc32(f"grammar:{req_id}:{position}".encode()))
    banned = set(spec.stop_token_ids) | {word[-1] for word in spec.bad_words} if spec is not None else set()
    free = np.setdiff1d(np.arange(vocab_size), np.fromiter(banned, dtype=np.int64, count=len(banned)))
    first = int(rng.choice(free)) if free.size else 0
    rest = rng.choice(np.setdiff1d(np.arange(vocab_size), [first]), size=min(size, vocab_size) - 1, replace=False)
    return tuple(sorted({first, *(int(t) for t in rest)}))
