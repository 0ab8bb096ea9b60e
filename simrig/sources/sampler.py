"""The synthetic sampler that closes the loop around the real scheduler.

After each ``schedule()``, ``SyntheticSampler`` decides per scheduled request what the
model would have produced: nothing for a prefill chunk, else accepted drafts and one
token, each possibly the stop token. Token ids follow ``synth_token`` (``simrig/step.py``)
so a replay can predict every input id.

See docs/recording.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from simrig.step import Step, synth_token


@dataclass
class SampleResult:
    sampled: dict[str, list[int]] = field(default_factory=dict)  # req_id -> token ids
    rejected: dict[str, int] = field(default_factory=dict)  # req_id -> rejected drafts


class SyntheticSampler:
    """After each ``schedule()``, what the model would have produced per scheduled request::

        prompt not yet fully computed    -> nothing (a prefill chunk samples no token)
        otherwise, with k drafts          -> accept drafts one by one with
                                             probability acceptance_rate, stop at the
                                             first rejection: 1 + accepted tokens,
                                             rejected = k - accepted
        each sampled token                -> with probability eos_prob the stop token
                                             (the request ends), else
                                             synth_token(req_id, position)

    The drafter stand-in proposes ``synth_token(req_id, n + j)`` for the next k
    positions, matching the harness's drafter.
    """

    def __init__(self, *, seed: int = 0, acceptance_rate: float = 0.7, eos_prob: float = 0.0,
                 stop_token_id: int = -1, num_speculative_tokens: int = 0):
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate: must be in [0, 1], got {acceptance_rate}")
        if not 0.0 <= eos_prob <= 1.0:
            raise ValueError(f"eos_prob: must be in [0, 1], got {eos_prob}")
        self.rng = random.Random(seed)
        self.acceptance_rate = acceptance_rate
        self.eos_prob = eos_prob
        self.stop_token_id = stop_token_id
        self.num_speculative_tokens = num_speculative_tokens

    def sample(self, step: Step, progress) -> SampleResult:
        """``progress(req_id) -> (num_computed_tokens, num_tokens)`` as the
        scheduler holds them right after schedule() (computed already advanced
        by the scheduled tokens, drafts included)."""
        out = SampleResult()
        for req_id in step.num_scheduled_tokens:
            state = progress(req_id)
            if state is None:
                continue
            computed, num_tokens = state
            k = step.spec_tokens.get(req_id, 0)
            if computed - k < num_tokens:
                continue  # prefill chunk: the prompt (or resumed context) is not done
            accepted = 0
            while accepted < k and self.rng.random() < self.acceptance_rate:
                accepted += 1
            tokens = []
            for j in range(accepted + 1):
                if self.eos_prob and self.rng.random() < self.eos_prob:
                    tokens.append(self.stop_token_id)
                    break
                tokens.append(synth_token(req_id, num_tokens + j))
            out.sampled[req_id] = tokens
            if k:
                out.rejected[req_id] = k - accepted
        return out

    def drafts(self, req_ids, progress) -> dict[str, list[int]]:
        """Draft proposals for the next step (the scheduler drops those of
        requests still in a prefill chunk)."""
        k = self.num_speculative_tokens
        out = {}
        if k <= 0:
            return out
        for req_id in req_ids:
            state = progress(req_id)
            if state is None:
                continue
            _, num_tokens = state
            out[req_id] = [synth_token(req_id, num_tokens + j) for j in range(k)]
        return out
