"""Prompt logprobs the runner hands the scheduler (``prompt_logprobs_dict``), judged from their meaning.

``SamplingParams.prompt_logprobs``: "Number of log probabilities to return per prompt token.
When set to -1, return all `vocab_size` log probabilities." The first prompt token has none
(``create_prompt_logprobs``: "logprob of first prompt token is None"): the row of position p
scores prompt token p + 1 from the logits at p, L - 1 rows for a prompt of L tokens. The
engine "aggregates prompt chunk logprobs over one or more prefill chunks" (``LogprobsProcessor``):

    an admission       rows for positions c0 .. L-2 once each, in order, none past what a step
                       computed, all in when the prompt completes (c0: computed when admitted)
    resumed after its prompt: none ("must have been computed before preemption", sample_tokens);
    preempted mid-prompt: the next admission starts over; a request that did not ask: none
    a row              k + 1 columns (-1: vocab_size + 1): the prompt token, its logprob and rank,
                       then the k most likely; log-softmax of the raw row (``raw_logprobs``) within TOL
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.observe import POSTPROCESS, StepObs
from simrig.sampling.logits import spread_logits, spreads
from simrig.sampling_checks.logprobs import TOL, _logsumexp, _one_hot
from simrig.step import Step, synth_token

FIELD = "output.prompt_logprobs"
ROWS_PAST_PROMPT = "rows_past_prompt"  # rows at or past the prompt's last position


@dataclass
class _Asked:
    k: int  # prompt logprobs per position (-1: the whole vocabulary)
    prompt: list[int]
    spread: bool  # its rows are spread logits (else the one-hot rows of the token rule)
    next: int  # the position the next row is due for
    done: bool = False  # no row is due this admission


class PromptLogprobsCheck:
    """Each request's prompt rows, followed across its chunks and admissions."""

    def __init__(self, num_speculative_tokens: int, vocab_size: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.vocab_size = vocab_size
        self.asked: dict[str, _Asked] = {}
        self.unjudged: set[str] = set()  # streaming-input requests: their prompt grows

    def check(self, index: int, step: Step, obs: StepObs) -> list[Finding]:
        """This step's prompt rows against what each request asked and computed."""
        for req_id in (*step.finished, *step.preempted):
            self.asked.pop(req_id, None)
            self.unjudged.discard(req_id)
        computed = {c.req_id: c.num_computed_tokens for c in step.cached}
        for req in step.new_requests:
            self.asked.pop(req.req_id, None)
            self.unjudged.discard(req.req_id)
            computed[req.req_id] = req.num_computed_tokens
            k = req.sampling.prompt_logprobs if req.sampling is not None else None
            if req.streaming:
                self.unjudged.add(req.req_id)
            elif k is not None:
                self.asked[req.req_id] = _Asked(
                    k, req.prefill_token_ids()[: req.prompt_len],
                    # rows start where it is admitted: a scheduler hands such a request no cached
                    # prefix (SamplingParams.skip_reading_prefix_cache), a trace may
                    spreads(req.sampling, self.num_speculative_tokens), req.num_computed_tokens,
                    done=req.num_prefill_tokens > req.prompt_len)
        seen = obs.sampled
        if obs.step_failed() or seen is None:
            for req_id in step.num_scheduled_tokens:  # rows unseen: nothing more is judged
                if req_id in self.asked:
                    self.asked[req_id].done = True
            return []
        out: list[Finding] = []
        for req_id, rows in (seen.get("prompt_logprobs") or {}).items():
            if rows is None or req_id in self.unjudged:
                continue
            req = self.asked.get(req_id)
            if req is None:
                out.append(_finding(index, req_id, "none (it did not ask)", f"{len(rows.logprobs)} rows",
                                    "prompt logprobs are computed only for a request that asks"))
                continue
            reach = computed.get(req_id, 0) + step.num_scheduled_tokens.get(req_id, 0)
            problem = self._rows_problem(req_id, req, rows, min(reach, len(req.prompt) - 1))
            if problem:
                req.done = True  # one finding per admission: the rows after it would all be off
                out.append(_finding(index, req_id, *problem[:3], pattern=problem[3] if len(problem) > 3 else ""))
        for req_id, req in self.asked.items():
            reach = computed.get(req_id, 0) + step.num_scheduled_tokens.get(req_id, 0)
            if not req.done and req_id in step.num_scheduled_tokens and reach >= len(req.prompt):
                req.done = True
                if req.next < len(req.prompt) - 1:
                    out.append(_finding(index, req_id, f"rows to position {len(req.prompt) - 2}",
                                        f"rows to position {req.next - 1}", "every prompt position "
                                        "has its row by the step the prompt completes"))
        return out

    def _rows_problem(self, req_id: str, req: _Asked, rows: Any, reach: int) -> tuple[str, ...] | None:
        """What is wrong with one request's rows of this step (None when nothing is)."""
        ids = np.asarray(rows.logprob_token_ids, dtype=np.int64)
        vals = np.asarray(rows.logprobs, dtype=np.float64)
        ranks = np.asarray(rows.selected_token_ranks, dtype=np.int64)
        first, last = req.next, req.next + len(ids) - 1
        if req.done or last >= reach:
            due = "none" if req.done else f"positions {first} .. {reach - 1}"
            # a row at the prompt's last position or later scores no prompt token (the last row
            # predicts the first output): its own pattern, apart from a row early or repeated
            past = ROWS_PAST_PROMPT if not req.done and last >= len(req.prompt) - 1 else ""
            return due, f"positions {first} .. {last}", "rows only for prompt positions computed so far, once each", \
                past
        width = (self.vocab_size if req.k == -1 else req.k) + 1
        if ids.shape[1] != width:
            return f"{width} columns", f"{ids.shape[1]} columns", \
                "a row holds the prompt token and the number of most likely tokens asked for"
        for i, pos in enumerate(range(first, last + 1)):
            raw = spread_logits(req_id, pos, self.vocab_size).astype(np.float64) if req.spread \
                else _one_hot(synth_token(req_id, pos + 1), self.vocab_size)
            logp = raw - _logsumexp(raw)
            wrong = _row_problem(logp, req.prompt[pos + 1], ids[i], vals[i], int(ranks[i]))
            if wrong:
                return f"position {pos}: {wrong[0]}", wrong[1], \
                    "the row of position p scores prompt token p + 1 from the raw logits at p"
        req.next = last + 1
        return None


def _row_problem(logp: np.ndarray, token: int, ids: np.ndarray, vals: np.ndarray,
                 rank: int) -> tuple[str, str] | None:
    """(expected, got) for the first column of a row that is wrong, else None."""
    if int(ids[0]) != token:
        return f"prompt token {token}", f"token {int(ids[0])}"
    if not _close(vals[:1], logp[[token]]).all():
        return f"its logprob {logp[token]:.6g}", f"{vals[0]:.6g}"
    if rank not in (1 + int(np.sum(logp > logp[token] + TOL)), 1 + int(np.sum(logp > logp[token]))):
        return f"rank {1 + int(np.sum(logp > logp[token]))}", f"rank {rank}"
    top = ids[1:]
    if len(top) == 0:
        return None
    kth = np.sort(logp)[::-1][len(top) - 1]
    if len(set(top.tolist())) != len(top) or not np.all(logp[top] >= kth - TOL):
        return f"the {len(top)} most likely tokens", "other tokens"
    bad = ~_close(vals[1:], logp[top])
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        return f"token {int(top[j])} at {logp[top[j]]:.6g}", f"{vals[1 + j]:.6g}"
    return None


def _close(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # -inf against -inf: equal
        return (a == b) | (np.abs(a - b) <= TOL * (1 + np.abs(b)))


def _finding(index: int, req_id: str, expected: str, actual: str, message: str, pattern: str = "") -> Finding:
    return Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="sampling", req_ids=(req_id,),
                   field=FIELD, expected=expected, actual=actual, message=f"{message}: {req_id}",
                   extra={"pattern": pattern} if pattern else {})
