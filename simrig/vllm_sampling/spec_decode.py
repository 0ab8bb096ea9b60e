"""Speculative decoding with vLLM's own samplers: the verifier observed, spread drafts proposed.

    vllm_samplers(runner, method)   vLLM's Sampler (in a SamplerSwitch that always samples with
                                    it, observed) and its RejectionSampler, whose _verify is
                                    wrapped: each logit row's processed values and sampled token
                                    land in the switch's rows, as Sampler.sample's do
    SpreadDrafts                    the drafter stand-in's drafts for a spread (greedy) request:
                                    simrig.sampling.drafts from its spec, prompt and the tokens
                                    the runner handed it (SpreadFeed), so strict verification
                                    keeps exactly the drafts the trace keeps

A row past a request's sampled tokens (a rejected draft's successors) records -1.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import numpy as np

from simrig.sampling.drafts import spread_drafts
from simrig.sampling.params import SamplingSpec
from simrig.step import Step
from simrig.vllm_sampling.feed import SpreadFeed
from simrig.vllm_sampling.switch import SampledRows, SamplerSwitch, build_sampler


def vllm_samplers(runner: Any, method: str) -> tuple[Any, Any]:
    """vLLM's own Sampler and RejectionSampler, built as the runner builds them
    (``load_model``) under ``rejection_sample_method`` = ``method``. On one-hot rows every
    method's outcome is the trace's: a draft is kept iff it is the row's token, and any
    token sampled from a row is that row's token, at any temperature."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    real = build_sampler(runner)
    # the VllmConfig is shared between runners (vllm_parts.vllm_config): the method is set on a copy
    spec_config = copy.copy(runner.vllm_config.speculative_config)
    spec_config.rejection_sample_method = method
    switch = SamplerSwitch(real, real)  # vLLM's sampler for every batch, as before; observed
    verifier = RejectionSampler(real, spec_config, runner.device)
    _observe_verify(verifier, switch)
    return switch, verifier


def _observe_verify(verifier: Any, switch: SamplerSwitch) -> None:
    verify = verifier._verify
    params = inspect.signature(verify)

    def observed(*args: Any, **kwargs: Any) -> Any:
        out = verify(*args, **kwargs)
        bound = params.bind(*args, **kwargs).arguments
        processed, sampled, num_sampled = out
        cu = bound["cu_num_logits"].cpu().numpy()
        tokens, counts = sampled.cpu().numpy(), num_sampled.cpu().numpy()
        flat = np.full(int(cu[-1]), -1, dtype=np.int64)
        for i in range(len(cu) - 1):
            n = min(int(counts[i]), int(cu[i + 1] - cu[i]))
            flat[int(cu[i]): int(cu[i]) + n] = tokens[i, :n]
        switch.rows.append(SampledRows(processed.detach().cpu().float().numpy().copy(), flat,
                                       bound["expanded_idx_mapping"].cpu().numpy().astype(np.int64).copy()))
        return out

    verifier._verify = observed


class SpreadDrafts:
    """Per runner: the drafts of the feed's spread requests (the others: None, the token rule)."""

    def __init__(self, feed: SpreadFeed, vocab_size: int) -> None:
        self.feed, self.vocab_size = feed, vocab_size
        self.reqs: dict[str, tuple[SamplingSpec, list[int]]] = {}  # spread request -> (spec, prompt)

    def learn(self, step: Step) -> None:
        """After ``SpreadFeed.learn``: each new spread request's spec and prompt."""
        for req in step.new_requests:
            if req.req_id in self.feed.given and req.sampling is not None:
                self.reqs[req.req_id] = (req.sampling, req.prefill_token_ids()[: req.prompt_len])
            else:
                self.reqs.pop(req.req_id, None)

    def __call__(self, req_id: str, first: int, num_drafts: int, first_rejected: int,
                 allowed: tuple[int, ...] | None = None) -> list[int] | None:
        """The draft ids of ``req_id`` from position ``first`` (None: not spread); ``allowed``:
        the verifying step's grammar for it."""
        if req_id not in self.feed.given or req_id not in self.reqs:
            return None
        spec, prompt = self.reqs[req_id]
        return spread_drafts(req_id, spec, prompt, self.feed.given[req_id], first, num_drafts, first_rejected,
                             self.vocab_size, allowed)
