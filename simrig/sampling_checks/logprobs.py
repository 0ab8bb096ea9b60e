"""The logprobs the runner hands the scheduler, judged from each row's raw logits.

``SamplingParams.logprobs``: "number of log probabilities to return per output token ...
the result includes the log probabilities of the specified number of most likely tokens,
as well as the chosen tokens" (-1: the whole vocabulary). Values: the log-softmax of the raw
row the trace names (``raw_logprobs``), grammar-masked as the runner masks it:

    column 0        the token handed to the scheduler, its logprob, its rank (1 + tokens above it)
    columns 1..K    K most likely tokens of the row, their logprobs (K: the most the batch asks)

One row per generated token: request i's from ``cu_num_generated_tokens[i]`` under drafts
(``LogprobsLists.slice_request``), token j's from position ``last - k + j`` (docs/sampling.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.observe import POSTPROCESS
from simrig.sampling.logits import spread_logits
from simrig.step import synth_token

TOL = 1e-3  # float32 log-softmax against the float64 one


def check_logprobs(index: int, seen: dict[str, Any], reqs: dict[str, Any], sampling: dict[str, int],
                   handed: dict[str, list], vocab_size: int, grammar: dict[str, Any] | None = None,
                   drafts: dict[str, int] | None = None) -> list[Finding]:
    """Findings about the logprobs of one step's batch (``handed``: batch order); judged only
    where vLLM's own sampler sampled it (the stand-in computes none). ``grammar``: the step's
    allowed tokens per structured-output request; ``drafts``: its drafts per request."""
    if not seen.get("calls"):
        return []
    lp = seen.get("logprobs")
    asked = [reqs[r].spec.logprobs for r in handed if r in reqs and reqs[r].spec is not None
             and reqs[r].spec.logprobs is not None]
    want_k = max(vocab_size if k == -1 else k for k in asked) if asked else None
    if lp is None or want_k is None:
        if (lp is None) != (want_k is None):
            return [_finding(index, tuple(handed), "output.logprobs", "present" if want_k is not None else "absent",
                             "absent" if lp is None else "present",
                             "logprobs are computed exactly when a request of the batch asks for them")]
        return []
    ids, vals = np.asarray(lp.logprob_token_ids), np.asarray(lp.logprobs, dtype=np.float64)
    cu = getattr(lp, "cu_num_generated_tokens", None)
    if ids.shape[1] != want_k + 1:
        return [_finding(index, tuple(handed), "output.logprobs", f"{want_k + 1} columns", f"{ids.shape[1]} columns",
                         "the batch's logprobs hold the chosen token and the most any request asks for")]
    bad = []
    for i, req_id in enumerate(handed):
        last, req = sampling.get(req_id), reqs.get(req_id)
        if last is None or req is None or not handed[req_id]:
            continue
        # the rows the scheduler takes (slice_request); the positions they were sampled after
        start, k = i if cu is None else int(cu[i]), (drafts or {}).get(req_id, 0)
        for j, token in enumerate(handed[req_id]):
            row, pos = start + j, last - k + j
            if not 0 <= row < len(ids) or _row_problem(_logp(req, req_id, pos, vocab_size, grammar), int(token),
                                                       ids[row], vals[row], int(lp.sampled_token_ranks[row])):
                bad.append(req_id)
                break
    if bad:
        return [_finding(index, tuple(bad), "output.logprobs", "the log-softmax of each row's raw logits",
                         "other tokens, values or ranks", "a row's logprobs: the chosen token's, its rank and the "
                         "most likely tokens', from the raw logits of the row it was sampled from")]
    return []


def _logp(req: Any, req_id: str, pos: int, vocab_size: int, grammar: dict[str, Any] | None) -> np.ndarray:
    """The log-softmax of the raw row at ``pos``, which the trace names; grammar-masked where the
    grammar reached the runner (a spread request's: one-hot rows get no mask, as under
    ``SIMRIG_SAMPLER=stand-in``, where no grammar is handed on)."""
    raw = spread_logits(req_id, pos, vocab_size) if req.spread else _one_hot(synth_token(req_id, pos + 1), vocab_size)
    allowed = (grammar or {}).get(req_id) if req.spread else None
    if allowed is not None:
        raw = np.where(np.isin(np.arange(vocab_size), list(allowed)), raw, -np.inf)
    return raw.astype(np.float64) - _logsumexp(raw.astype(np.float64))


def _row_problem(logp: np.ndarray, token: int, ids: np.ndarray, vals: np.ndarray, rank: int) -> bool:
    if int(ids[0]) != token or not _close(vals[0], logp[token]):
        return True
    if rank != 1 + int(np.sum(logp > logp[token] + TOL)) and rank != 1 + int(np.sum(logp > logp[token])):
        return True
    top = ids[1:].astype(np.int64)
    if len(top) == 0:
        return False
    kth = np.sort(logp)[::-1][len(top) - 1]
    return not (all(_close(v, logp[t]) for v, t in zip(vals[1:], top)) and np.all(logp[top] >= kth - TOL))


def _close(a: float, b: float) -> bool:
    return bool(a == b or abs(a - b) <= TOL * (1 + abs(b)))


def _one_hot(token: int, vocab_size: int) -> np.ndarray:
    row = np.full(vocab_size, -np.inf)
    row[token] = 0.0
    return row


def _logsumexp(x: np.ndarray) -> float:
    m = np.max(x)
    return float(m + np.log(np.sum(np.exp(x - m))))


def _finding(index: int, req_ids: tuple, field: str, expected: str, actual: str, message: str) -> Finding:
    return Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="sampling", req_ids=req_ids,
                   field=field, expected=expected, actual=actual, message=message)
