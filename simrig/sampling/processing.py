"""What a request's sampling parameters make of one logit row: the reference for vLLM's
sampler, each stage written from the meaning ``SamplingParams`` documents for its field,
in the order the sampler's pipeline states ("bias adds, penalties scale"; top-k/p last),
after the grammar bitmask, which ``GPUModelRunner.sample`` applies to the logits before it
calls the sampler ("Apply grammar bitmask to the logits in-place"):

    logits ─► grammar: -inf outside the allowed set ─► + logit_bias ─► stop ids masked (min_tokens)
           ─► repetition (prompt and outputs), frequency and presence (outputs) penalties
           ─► bad words: a word's last token masked when the outputs end with its prefix
           ─► / temperature ─► min_p ─► top_k ─► top_p ─► support (-inf outside)

Temperature 0 is greedy (``SamplingParams`` resets top-p, top-k and min-p; the token is the
argmax); one in (0, 0.01) is raised to 0.01. A token on a top-k/top-p/min-p cut, where float
order decides, is marked uncertain.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from simrig.sampling.params import SamplingSpec

MIN_TEMPERATURE = 0.01  # SamplingParams raises a temperature in (0, 0.01) to this
BOUNDARY_TOL = 1e-4  # log-ratio within which float order decides a min-p or top-k cut
# Top-p is judged to 1 % of the row's mass: a kernel may find its cut approximately (vLLM's
# Triton top-k/top-p kernel estimates the row's statistics from a sample of its tokens and
# stops bisecting after 18 steps; on 40 spread rows it kept 1-12 tokens fewer than the
# definition on 8), so a token whose mass above sits within 1e-2 of top_p may fall either side
TOP_P_TOL = 1e-2


@dataclass
class ExpectedRow:
    """The processed row: ``values`` -inf outside the support. # [vocab_size] each"""

    values: np.ndarray  # float64
    uncertain: np.ndarray  # bool: on a top-k / top-p / min-p cut
    greedy: bool


def expected_row(spec: SamplingSpec | None, logits: np.ndarray, prompt: Sequence[int],
                 outputs: Sequence[int], allowed: Sequence[int] | None = None) -> ExpectedRow:
    """The row vLLM's sampler must sample ``outputs``' next token from; ``allowed``: the
    tokens a structured-output request's grammar allows there (None: no grammar)."""
    x = logits.astype(np.float64)
    uncertain = np.zeros(x.shape, dtype=bool)
    spec = spec or SamplingSpec()
    if allowed is not None:  # the grammar bitmask: a token it does not allow can never be sampled
        outside = np.ones(x.shape, dtype=bool)
        outside[np.asarray(allowed, dtype=np.int64)] = False
        x[outside] = -np.inf
    for token, bias in spec.logit_bias:  # "bias added to the logits of the given tokens"
        x[token] += bias
    if len(outputs) < spec.min_tokens and spec.stop_token_ids:
        # "minimum number of tokens to generate before EOS or stop_token_ids can be generated"
        x[list(spec.stop_token_ids)] = -np.inf
    _penalise(x, spec, prompt, outputs)
    for word in spec.bad_words:
        # "only the last token of a sequence is not allowed when the next generated token
        # can complete the sequence": its prefix must be the generated text's tail
        prefix = tuple(word[:-1])
        if len(prefix) <= len(outputs) and tuple(outputs[len(outputs) - len(prefix):]) == prefix:
            x[word[-1]] = -np.inf
    greedy = spec.temperature == 0.0
    if greedy:
        return ExpectedRow(x, uncertain, True)
    x /= max(spec.temperature, MIN_TEMPERATURE)
    if spec.min_p > 0.0:
        # "minimum probability for a token to be considered, relative to the most likely token"
        cut = np.max(x) + np.log(spec.min_p)
        uncertain |= np.abs(x - cut) < BOUNDARY_TOL
        x[x < cut] = -np.inf
    if 0 < spec.top_k < x.size:
        # "number of top tokens to consider"
        kth = np.sort(x)[::-1][spec.top_k - 1]
        uncertain |= np.isfinite(x) & np.isclose(x, kth, rtol=0.0, atol=BOUNDARY_TOL)
        x[x < kth] = -np.inf
    if spec.top_p < 1.0:
        # "cumulative probability of the top tokens to consider": the smallest set of most
        # likely tokens whose mass reaches top_p, i.e. a token stays while the mass of the
        # tokens above it is below top_p
        probs = _softmax(x)
        order = np.argsort(-x, kind="stable")
        above = np.empty_like(probs)
        above[order] = np.cumsum(probs[order]) - probs[order]
        uncertain |= np.isfinite(x) & (np.abs(above - spec.top_p) < TOP_P_TOL)
        x[above >= spec.top_p] = -np.inf
    return ExpectedRow(x, uncertain, False)


def _penalise(x: np.ndarray, spec: SamplingSpec, prompt: Sequence[int], outputs: Sequence[int]) -> None:
    """repetition_penalty: "penalizes new tokens based on whether they appear in the prompt
    and the generated text so far" (a logit > 0 divided by it, else multiplied);
    frequency_penalty: "based on their frequency in the generated text so far";
    presence_penalty: "based on whether they appear in the generated text so far"."""
    if spec.repetition_penalty != 1.0:
        seen = np.fromiter(set(prompt) | set(outputs), dtype=np.int64)
        if seen.size:
            vals = x[seen]
            x[seen] = np.where(vals > 0, vals / spec.repetition_penalty, vals * spec.repetition_penalty)
    if (spec.frequency_penalty or spec.presence_penalty) and outputs:
        counts = Counter(outputs)
        tokens = np.fromiter(counts, dtype=np.int64)
        n = np.fromiter(counts.values(), dtype=np.float64)
        x[tokens] -= spec.frequency_penalty * n + spec.presence_penalty


def _softmax(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    out = np.zeros_like(x)
    if finite.any():
        e = np.exp(x[finite] - np.max(x[finite]))
        out[finite] = e / e.sum()
    return out
