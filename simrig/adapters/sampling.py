"""The sampler and drafter stand-ins: the trace's tokens, then vLLM's own post-update.

``sample_tokens`` needs a model's logits (and, under PCP, a process group),
so after ``execute_model`` the harness picks the trace's tokens itself and
hands them to the real ``get_num_sampled_and_rejected`` and
``GPUModelRunner.postprocess_sampled``. Drafts are written where MRV2 reads
them, ``req_states.draft_tokens``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.step import Step, draft_token, rejected_from, synth_token


def write_drafts(api: Any, runner: Any, step: Step) -> None:
    """Drafter stand-in: draft j of a request at position n proposes position
    n+1+j; drafts the trace says the sampler rejects propose a wrong token
    (``simrig.step.draft_token``), so acceptance shows in input_ids."""
    if not step.spec_tokens:
        return
    states = runner.req_states
    for req_id, k in step.spec_tokens.items():
        idx = states.req_id_to_index.get(req_id)
        if idx is None or k <= 0:
            continue  # an unknown id fails loudly in gather, where the runner looks it up
        # drafts fill the last k positions of the request's query
        first = int(states.num_computed_tokens_np[idx]) + step.num_scheduled_tokens.get(req_id, 0) - k
        first_rejected = rejected_from(step, req_id)
        ids = [draft_token(req_id, first + j, j >= first_rejected) for j in range(k)]
        states.draft_tokens[idx, :k] = api.torch.tensor(ids, dtype=states.draft_tokens.dtype)

def sample(api: Any, runner: Any, step: Step, batch: Any) -> dict[str, Any]:
    """Sampler stand-in, then the real postprocess_sampled.

    Row i samples (num_logits_i - rejected_i) tokens; the token sampled
    from a request's logit that ends at sequence position p is
    synth_token(req, p + 1), so every position has one well-defined id.
    """
    torch = api.torch
    n = batch.num_reqs
    cu = batch.cu_num_logits_np[: n + 1]
    num_logits = np.diff(cu).astype(np.int32)
    seq_lens = batch.seq_lens[:n].cpu().numpy()
    width = max(int(num_logits.max()), 1)
    sampled = np.zeros((n, width), dtype=np.int64)
    num_sampled = num_logits.copy()
    for i, req_id in enumerate(batch.req_ids):
        first = int(seq_lens[i]) - int(num_logits[i]) + 1
        sampled[i, : num_logits[i]] = [synth_token(req_id, first + j)
                                       for j in range(int(num_logits[i]))]
        num_sampled[i] -= min(step.rejected.get(req_id, 0), int(num_logits[i]) - 1)
    device = api.device
    num_sampled_t, num_rejected_t = api.get_num_sampled_and_rejected(
        torch.from_numpy(num_sampled).to(device), batch.seq_lens[:n], batch.cu_num_logits,
        batch.idx_mapping, runner.req_states.prefill_len.gpu)
    runner.postprocess_sampled(
        batch.idx_mapping, torch.from_numpy(sampled).to(device), num_sampled_t,
        num_rejected_t, batch.query_start_loc)
    return {"num_sampled": num_sampled_t, "num_rejected": num_rejected_t}
