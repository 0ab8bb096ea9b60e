"""Spec-decode outcomes: the sampled token rows and what postprocess writes back, from the Step's meaning.

``postprocess_sampled`` writes the sampler's (or the rejection sampler's) token rows and
per-row counts into the request state. ``expected_outcomes`` derives what it must write from
the trace alone (a request's drafts and the drafts the trace rejects,
``simrig.step.rejected_from``) and from the meaning vLLM's comments give each value;
``check_spec_outcomes`` compares (the table is in its docstring). See docs/known-findings.md,
'Spec-decode outcomes'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import POSTPROCESS, StepObs
from simrig.step import RunnerConfig, Step, synth_token


def expected_outcomes(step: Step, pred: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sampled counts, first sampled position, computed tokens after the step), per row of ``pred``.

    A row still in chunked prefill after this step samples nothing; any other
    row samples its accepted drafts plus one token (the target's token at the
    first rejected draft, or the bonus token)."""
    rows = pred.req_ids
    chunked = pred.num_computed + pred.num_scheduled < pred.prefill_len
    rejected = np.array([min(step.rejected.get(r, 0), step.spec_tokens.get(r, 0)) for r in rows],
                        dtype=np.int64)
    sampled = np.where(chunked, 0, 1 + pred.num_drafts - rejected)
    first = pred.num_computed + pred.num_scheduled - pred.num_drafts
    computed = np.array([int(c) + step.num_accepted(r) for r, c in zip(rows, pred.num_computed)],
                        dtype=np.int64)
    return sampled.astype(np.int64), first.astype(np.int64), computed


@guarded("spec_outcomes")
def check_spec_outcomes(index: int, config: RunnerConfig, step: Step, obs: StepObs, pred: Any,
                        skip: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for the module docstring's values, against the model's ``pred``.

    ``sample_tokens`` hands ``postprocess_sampled`` the sampler's (or the rejection
    sampler's) token rows, one row per request of the batch, and the per-row
    counts; ``postprocess_sampled`` writes the outcome into the request state.
    The expectations come from the trace alone (a request's drafts ``d`` and the
    drafts the trace says are rejected ``r``, ``simrig.step.rejected_from``) and
    from the meaning vLLM's comments give each value, never from vLLM's code:

        value (postprocess)         expectation                            source (vLLM 0.33.0)
        ───────────────────         ───────────                            ────────────────────
        sampled_tokens[i, :s]       the trace's tokens at the s positions  SamplerOutput.sampled_token_ids
                                    sampled: the d - r accepted drafts,    ("[num_reqs, num_speculative_steps
                                    then the target's token at the first   + 1]"); rejection kernel: "Greedy
                                    rejected draft or, every draft kept,   sampling. Accept IFF draft matches
                                    the bonus token, in column d - r (so   target argmax", "Target argmax is
                                    at the right column when d < K)        stored directly"; the bonus is "the
                                                                           last (bonus) position"
        s (the count above)         d - r + 1 for a row whose prompt is    Sampler.__call__: "1 sampled token per
                                    done after this step (a final          request, except chunked-prefill
                                    prefill chunk: d = 0, so 1); 0 for a   requests"; get_num_sampled_and_rejected:
                                    chunk that ends before the prompt's    is_chunked_prefilling = seq_len <
                                    end                                    prefill_len
        post.last_sampled_tokens    the last token sampled (s > 0)         RequestState: "# Last sampled tokens."
        post.num_computed_tokens    computed + scheduled - rejected        Step.num_accepted, the continuity rule
                                    (a chunk that ends early: + its        the scheduler keeps ("computed(k+1) =
                                    scheduled tokens, nothing rejected)    computed(k) + scheduled(k) - rejected")

    Rows with no sampled token keep their last sampled token; that is not judged
    (the model does not follow a row's last token across steps).
    """
    post = obs.get(POSTPROCESS)
    if pred is None or post is None or post.error is not None or not post.fields:
        return []
    rows = pred.req_ids
    n = len(rows)
    sampled, first, computed = expected_outcomes(step, pred)
    out: list[Finding] = []

    def add(field: str, bad: list[str], expected: str, actual: str, message: str) -> None:
        bad = [r for r in bad if r not in skip  # a spread request's tokens: simrig.sampling_checks'
               and (r not in pred.spread or field.endswith("computed_tokens"))]
        if bad:
            out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS,
                               check="spec_outcomes", req_ids=tuple(bad), field=field,
                               expected=expected, actual=actual, message=message))

    tokens = _array(post, "sampled_tokens")
    if tokens is not None and tokens.ndim == 2:
        bad, got, want = [], [], []
        for i, r in enumerate(rows):
            s = int(sampled[i])
            expect = [synth_token(r, int(first[i]) + j) for j in range(s)]
            row = tokens[i, :s].tolist() if i < tokens.shape[0] and s <= tokens.shape[1] else None
            if row != expect:
                bad.append(r)
                got.append(row)
                want.append(expect)
        add("sampled_tokens", bad, str(want), str(got),
            "the sampled row of a request: its accepted drafts, then the target's token at the "
            "first rejected draft or the bonus token, in column drafts - rejected")
    last = _array(post, "post.last_sampled_tokens")
    if last is not None and last.ndim == 1 and len(last) >= n:
        want_last = {r: synth_token(r, int(first[i] + sampled[i]) - 1)
                     for i, r in enumerate(rows) if sampled[i] > 0}
        bad = [r for i, r in enumerate(rows) if r in want_last and int(last[i]) != want_last[r]]
        add("post.last_sampled_tokens", bad, str([want_last[r] for r in bad]),
            str([int(last[rows.index(r)]) for r in bad]),
            "a request's last sampled token after postprocess is the last token it sampled")
    done = _array(post, "post.num_computed_tokens")
    if done is not None and done.ndim == 1 and len(done) >= n:
        bad = [r for i, r in enumerate(rows) if int(done[i]) != int(computed[i])]
        add("post.num_computed_tokens", bad, str([int(computed[rows.index(r)]) for r in bad]),
            str([int(done[rows.index(r)]) for r in bad]),
            "computed tokens after postprocess: those before the step plus the scheduled ones "
            "minus the rejected drafts")
    return out


def _array(post: Any, name: str) -> np.ndarray | None:
    f = post.fields.get(name)
    if f is None or f.kind not in ("numpy", "torch"):
        return None
    return np.asarray(f.values).astype(np.int64)
