"""The sampling stand-ins: logits that name the trace's tokens, greedy samplers, a drafter.

``GPUModelRunner.sample_tokens`` runs for real; ``GreedySampler``, ``GreedyVerifier`` (the
rejection sampler) and ``DrafterStandIn`` (the speculator) stand in for what needs a model or
costs a GPU kernel per vocabulary block. The logits (``simrig/vllm_sampling/token_names.py``)
name the trace's tokens (``synth_token`` and ``draft_token`` in ``simrig/step.py``).

See docs/standins.md, 'Sampling stand-ins and the token rule'.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from simrig.step import Step, draft_token, rejected_from
from simrig.vllm_sampling.spec_decode import vllm_samplers  # noqa: F401 -- wiring builds vLLM's samplers here
from simrig.vllm_sampling.token_names import target_tokens  # noqa: F401 -- the harness names the logit rows here


def write_drafts(api: Any, runner: Any, step: Step) -> None:
    """The drafter's output as the scheduler schedules it: draft j of a request
    at position n proposes position n+1+j; drafts the trace says the sampler
    rejects propose a wrong token (``simrig.step.draft_token``; a spread request's:
    ``simrig.sampling.drafts``), so acceptance shows in input_ids."""
    if not step.spec_tokens:
        return
    states, spread = runner.req_states, getattr(runner.speculator, "spread_drafts", None)
    for req_id, k in step.spec_tokens.items():
        idx = states.req_id_to_index.get(req_id)
        if idx is None or k <= 0:
            continue  # an unknown id fails loudly in gather, where the runner looks it up
        # drafts fill the last k positions of the request's query
        first = int(states.num_computed_tokens_np[idx]) + step.num_scheduled_tokens.get(req_id, 0) - k
        first_rejected = rejected_from(step, req_id)
        ids = (spread and spread(req_id, first, k, first_rejected, step.grammar.get(req_id))) or [
            draft_token(req_id, first + j, j >= first_rejected) for j in range(k)]
        states.draft_tokens[idx, :k] = api.torch.tensor(ids, dtype=states.draft_tokens.dtype)


class GreedySampler:
    """The sampler: each request's one logit row, its argmax. No penalties,
    no logprobs (traces request none), so no sampling state to keep."""

    compute_nans = False

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.penalties_state = SimpleNamespace(output_bin_counts=None)
        # read by execute_model's drafter call; the drafter stand-in ignores them
        self.sampling_states = SimpleNamespace(temperature=SimpleNamespace(gpu=None),
                                               seeds=SimpleNamespace(gpu=None))

    def add_request(self, *args: Any) -> None:
        pass

    def apply_staged_writes(self) -> None:
        pass

    def __call__(self, logits: Any, input_batch: Any) -> Any:
        # lazy: vllm and torch load after platform.configure() sets the env
        import torch
        from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected

        sampled = logits.argmax(dim=-1).to(torch.int64).view(-1, 1)
        # "1 sampled token per request, except chunked-prefill requests": the
        # same vLLM call the real Sampler makes
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            input_batch.seq_lens.new_ones(input_batch.num_reqs), input_batch.seq_lens,
            input_batch.cu_num_logits, input_batch.idx_mapping,
            self._runner.req_states.prefill_len.gpu)
        return _sampler_output(sampled, num_sampled, num_rejected)


class GreedyVerifier:
    """The rejection sampler under greedy decoding: a request's drafts are
    kept while each equals the target's argmax at that row; the sampled tokens
    are those targets up to the first mismatch, plus that row's target (the
    bonus token when every draft is kept)."""

    def __init__(self, runner: Any, width: int) -> None:
        self._runner = runner
        self._width = width  # decode_query_len: drafts + 1

    def __call__(self, logits: Any, input_batch: Any, draft_logits: Any = None,
                 invalid_drafts: Any = None) -> Any:
        # lazy: vllm and torch load after platform.configure() sets the env
        import torch
        from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected

        n = input_batch.num_reqs
        targets = logits.argmax(dim=-1).cpu().numpy()
        cu = input_batch.cu_num_logits_np[: n + 1]
        logits_indices = input_batch.logits_indices.cpu().numpy()
        input_ids = input_batch.input_ids.cpu().numpy()
        sampled = np.zeros((n, self._width), dtype=np.int64)
        counts = np.zeros(n, dtype=np.int32)
        for i in range(n):
            rows = range(int(cu[i]), int(cu[i + 1]))
            kept = 0
            for r in rows[:-1]:  # the token after row r's input is the draft it verifies
                if input_ids[logits_indices[r] + 1] != targets[r]:
                    break
                kept += 1
            sampled[i, : kept + 1] = targets[rows.start: rows.start + kept + 1]
            counts[i] = kept + 1
        device = input_batch.seq_lens.device
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            torch.from_numpy(counts).to(device), input_batch.seq_lens, input_batch.cu_num_logits,
            input_batch.idx_mapping, self._runner.req_states.prefill_len.gpu)
        return _sampler_output(torch.from_numpy(sampled).to(device), num_sampled, num_rejected)


class DrafterStandIn:
    """The speculator: one query per request, as EAGLE-style drafters take;
    ``propose`` returns the drafts already in ``req_states`` (the harness
    writes the trace's drafts when the scheduler schedules them)."""

    num_query_per_req = 1
    num_extra_query_per_req = 0
    supports_mm_inputs = False
    draft_logits = None  # strict verification needs no draft probabilities
    draft_token_confidence_probs = None

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def propose(self, input_batch: Any = None, *args: Any, **kwargs: Any) -> Any:
        states = self._runner.req_states
        return states.draft_tokens[input_batch.idx_mapping]

    def capture(self) -> None:
        pass

    def observe_verification(self, *args: Any) -> None:
        pass

    def prepare_watermarking(self, *args: Any) -> None:
        pass


def _sampler_output(sampled: Any, num_sampled: Any, num_rejected: Any) -> Any:
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None, num_nans=None,
                         num_sampled=num_sampled, num_rejected=num_rejected)
