"""The logits a sampled request's rows carry, named by the trace alone.

A request that states sampling parameters (a ``SamplingSpec`` asking for anything) gets,
on each logit row, a finite value for every token of the vocabulary: a pseudo-random
row fixed by the request id and the row's position, so that temperature, top-k, top-p,
min-p, penalties, logit bias, bad words and min-tokens each change what vLLM's sampler
computes, and the reference (``simrig.sampling.processing``) can compute the same row
without asking the runner. Every other request keeps the one-hot rows of the token rule
(``simrig.step.synth_token``), so traces without ``sampling`` objects replay unchanged;
under speculative decoding only greedy requests verified by vLLM's sampler are spread
(``spreads``; their drafts: ``simrig.sampling.drafts``).

    row of request r ending at position p:   spread_logits(r, p)   # [vocab_size]
    values: SPREAD_SCALE * N(0, 1), seeded by crc32("r:p")
"""

from __future__ import annotations

import os
import zlib

import numpy as np

from simrig.sampling.params import SamplingSpec

# SIMRIG_SAMPLER: "parameters" (default): vLLM's Sampler samples each batch holding a request
# with parameters, the greedy stand-in the others (on one-hot rows it picks the same tokens);
# "always": every batch; "stand-in": no request is spread and the stand-in samples every
# batch, as before sampling parameters were driven (a baseline for docs/benchmarks.md).
# Read on each call, so the harness and both oracles agree.
SAMPLER_ENV = "SIMRIG_SAMPLER"
SAMPLER_MODES = ("parameters", "always", "stand-in")

# Standard deviation of a spread row: a softmax of N(0, 2.5^2) over 4,096 tokens puts
# about half its mass on its top few dozen tokens, so top-k and top-p both cut somewhere
# meaningful, and every token stays finite (a penalty or bias always shows).
SPREAD_SCALE = 2.5


def spread_logits(req_id: str, position: int, vocab_size: int) -> np.ndarray:
    """The logit row of ``req_id`` ending at sequence position ``position``. # [vocab_size]"""
    seed = zlib.crc32(f"{req_id}:{position}".encode())
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(vocab_size, dtype=np.float32) * np.float32(SPREAD_SCALE))


class Drafting(int):
    """``num_speculative_tokens`` that also names the verifier judging the drafts
    (``RunnerConfig.rejection_sampler``: "" the greedy stand-in, else vLLM's
    ``RejectionSampler``). A plain int means the stand-in, as before."""

    rejection_sampler: str = ""

    def __new__(cls, num_speculative_tokens: int, rejection_sampler: str = "") -> "Drafting":
        self = super().__new__(cls, num_speculative_tokens)
        self.rejection_sampler = rejection_sampler
        return self


def drafting(config: object) -> Drafting:
    """A runner config's drafts and verifier, as ``spreads`` reads them."""
    return Drafting(getattr(config, "num_speculative_tokens", 0), getattr(config, "rejection_sampler", ""))


def spreads(spec: SamplingSpec | None, num_speculative_tokens: int, structured: bool = False) -> bool:
    """Whether a request's rows carry spread logits (and its tokens come from the sampler).

    Without drafts: a request whose spec asks for something or whose outputs follow a
    grammar (``structured``: the grammar bitmask masks its rows). Under speculative
    decoding (``num_speculative_tokens`` > 0) only a greedy request with parameters
    (temperature 0, with or without a grammar) verified by vLLM's own ``RejectionSampler``
    (``Drafting.rejection_sampler`` set): its kept drafts are its processed rows' argmax
    (``simrig.sampling.drafts``), so strict verification keeps exactly the trace's drafts.
    Any other request keeps the one-hot rows there: at temperature > 0 acceptance would be
    the sampler's choice, and the trace says which drafts are kept.
    """
    if sampler_mode() == "stand-in":
        return False
    asks = spec is not None and not spec.is_default
    if num_speculative_tokens == 0:
        return structured or asks
    return (asks and spec.temperature == 0.0
            and getattr(num_speculative_tokens, "rejection_sampler", "") != "")


def sampler_mode() -> str:
    """The ``SIMRIG_SAMPLER`` mode (one of ``SAMPLER_MODES``; anything else is the default)."""
    mode = os.environ.get(SAMPLER_ENV, "parameters")
    return mode if mode in SAMPLER_MODES else "parameters"
