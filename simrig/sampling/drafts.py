"""The drafts of a greedy spread request, so that verification keeps what the trace says.

Under speculative decoding a spread request (``simrig.sampling.logits.spreads``: greedy,
verified by vLLM's ``RejectionSampler``) has no one-hot row naming its next token, so the
drafter stand-in proposes from the processed rows instead: draft j (position first + j)
is checked against the row ending at first + j - 1, whose penalties and bad words read the
prompt, the tokens given so far and the drafts before it (vLLM's kernels count a step's
earlier drafts) and whose grammar, if the request has one, is the step's allowed set (the
verifying step's bitmask masks every row of the request). A draft the trace keeps is that
row's argmax (strict verification keeps it); one it rejects is the next token id (never the
argmax), as are the drafts after it:

    draft j = argmax(expected_row(spec, spread_logits(r, first + j - 1), prompt,
                                  outputs + drafts[:j], allowed))   (+ 1 if rejected)
"""

from __future__ import annotations

from typing import Collection, Sequence

import numpy as np

from simrig.sampling.logits import spread_logits
from simrig.sampling.params import SamplingSpec
from simrig.sampling.processing import expected_row


def spread_drafts(req_id: str, spec: SamplingSpec, prompt: Sequence[int], outputs: Sequence[int],
                  first: int, num_drafts: int, first_rejected: int, vocab_size: int,
                  allowed: Collection[int] | None = None) -> list[int]:
    """The ``num_drafts`` draft ids of ``req_id`` from position ``first``; drafts from index
    ``first_rejected`` on are rejected (``simrig.step.rejected_from``); ``allowed``: the
    verifying step's grammar for the request (None: it has none)."""
    drafts: list[int] = []
    for j in range(num_drafts):
        row = expected_row(spec, spread_logits(req_id, first + j - 1, vocab_size), prompt, [*outputs, *drafts],
                           allowed)
        best = int(np.argmax(row.values))
        drafts.append(best if j < first_rejected else (best + 1) % vocab_size)
    return drafts
