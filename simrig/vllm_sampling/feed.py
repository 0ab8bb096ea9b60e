"""The requests whose tokens are the sampler's, as the harness feeds them to the runner.

``SpreadFeed`` follows which held requests state sampling parameters (``spreads``), which
logit rows of a batch are theirs (the model stand-in spreads them), and the tokens the
runner handed the scheduler for them: a resumed one re-sends those (``NewRequest.
output_token_ids``), as a scheduler re-sends what it was given. ``histories`` reads each
batch request's stored history after sampling (``all_token_ids`` up to ``total_len``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from simrig.sampling.logits import spread_logits, spreads
from simrig.step import Step
from simrig.vllm_sampling.token_names import SpreadRows


class SpreadFeed:
    """Per runner: the spread requests and the tokens each was given."""

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.given: dict[str, list[int]] = {}  # spread request -> its tokens so far

    def clear(self) -> None:
        self.given.clear()

    def learn(self, step: Step) -> None:
        """A step's lifecycle: finished ones forgotten, new ones spread or not, resumed ones
        re-sending the tokens they were given (preempted ones keep theirs until then)."""
        for req_id in step.finished:
            self.given.pop(req_id, None)
        for req in step.new_requests:
            if not spreads(req.sampling, self.num_speculative_tokens, req.structured_output):
                self.given.pop(req.req_id, None)
                continue
            resent = req.num_prefill_tokens - req.prompt_len
            given = self.given.get(req.req_id, []) if resent > 0 and not req.streaming else []
            req.output_token_ids = given[:resent] or None
            self.given[req.req_id] = given[:resent]

    def rows(self, batch: Any) -> dict[int, tuple[str, int]]:
        """The batch's logit rows of spread requests: row -> (request, position)."""
        if not self.given:
            return {}
        n = batch.num_reqs
        num_logits = np.diff(batch.cu_num_logits_np[: n + 1])
        seq_lens = batch.seq_lens[:n].cpu().numpy()
        rows, row = {}, 0
        for i, req_id in enumerate(batch.req_ids):
            k = int(num_logits[i])
            if req_id in self.given:
                rows.update({row + j: (req_id, int(seq_lens[i]) - k + j) for j in range(k)})
            row += k
        return rows

    @staticmethod
    def logits(rows: dict[int, tuple[str, int]], vocab_size: int) -> SpreadRows:
        return SpreadRows({row: spread_logits(req_id, pos, vocab_size) for row, (req_id, pos) in rows.items()},
                          {req_id for req_id, _ in rows.values()})

    def handed(self, req_ids: Sequence[str], tokens: Sequence[Sequence[int]]) -> None:
        """What the runner handed the scheduler: a spread request's tokens, kept."""
        for req_id, out in zip(req_ids, tokens):
            if req_id in self.given:
                self.given[req_id].extend(int(t) for t in out)


def histories(runner: Any, batch: Any) -> dict[str, np.ndarray]:
    """Each batch request's stored token history after sampling: ``all_token_ids`` of its
    slot up to ``total_len`` (what penalties, bad words and drafters read)."""
    states = runner.req_states
    ids, total = getattr(states, "all_token_ids", None), getattr(states, "total_len", None)
    if ids is None or total is None:  # a release without a stored history
        return {}
    lens = total.gpu.cpu().numpy()
    slots = batch.idx_mapping_np[: batch.num_reqs]
    return {r: ids.gpu[int(s), : int(lens[int(s)])].cpu().numpy().astype(np.int64)
            for r, s in zip(batch.req_ids, slots)}
