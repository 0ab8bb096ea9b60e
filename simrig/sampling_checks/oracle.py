"""``SamplingOracle``: every sampled row of a request with sampling parameters, judged.

It follows each such request (``simrig.sampling.logits.spreads``): spec, prompt and the
tokens it was given (the runner's output to the scheduler). Per step, each row that samples
(its last scheduled position, prompt done; under drafts each of its rows, whose history
counts the step's earlier drafts, ``simrig.sampling.drafts``):

    processed logits   == processing.expected_row(spec, spread_logits(req, pos), prompt,
                          outputs, grammar): the same support (but cuts) and values
    grammar            (grammar.py) -inf outside the allowed set; the token inside it
    sampled token      inside its row (greedy: its largest); handed out as is; under drafts
                       exactly the trace's kept drafts, then one token (``_kept``)
    stored history     == prompt + every token given (all_token_ids to total_len; every request)
    logprobs           (logprobs.py) the sampled token's and the top ones', from the raw row
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.observe import POSTPROCESS, StepObs, handed_to_scheduler
from simrig.sampling.drafts import spread_drafts
from simrig.sampling.logits import drafting, spread_logits, spreads
from simrig.sampling.params import SamplingSpec
from simrig.sampling.processing import expected_row
from simrig.sampling_checks.grammar import check_grammar
from simrig.sampling_checks.logprobs import check_logprobs
from simrig.sampling_checks.prompt_logprobs import PromptLogprobsCheck
from simrig.step import SYNTH_VOCAB_SIZE, RunnerConfig, Step, rejected_from

ATOL, RTOL = 1e-3, 1e-4  # float32 kernels against the float64 reference
TOP_P_CUT, NO_TOP_P_CUT = "the top-p cut", "none: the row before top-p kept whole"


@dataclass
class _Request:
    spec: SamplingSpec | None  # None: vLLM's defaults
    prompt: list[int]
    outputs: list[int] = field(default_factory=list)  # every token it was given, in order
    prefill_len: int = 0
    spread: bool = False  # its rows are spread: its tokens are the sampler's


class SamplingOracle:
    """What vLLM's sampler computed for requests with parameters, step by step."""

    def __init__(self, config: RunnerConfig, vocab_size: int = SYNTH_VOCAB_SIZE) -> None:
        self.num_speculative_tokens = drafting(config)  # with its verifier: who spreads under drafts
        self.vocab_size = vocab_size
        self.reqs: dict[str, _Request] = {}
        self.prompt_rows = PromptLogprobsCheck(self.num_speculative_tokens, vocab_size)

    def check(self, index: int, step: Step, obs: StepObs) -> list[Finding]:
        """This step's findings; then what the requests were given is learnt."""
        prompt_rows = self.prompt_rows.check(index, step, obs)  # prompt logprobs come with any chunk
        for req_id in (*step.finished, *step.preempted):
            self.reqs.pop(req_id, None)
        for req in step.new_requests:
            ids = req.prefill_token_ids()
            spread = spreads(req.sampling, self.num_speculative_tokens, req.structured_output)
            self.reqs[req.req_id] = _Request(req.sampling, ids[: req.prompt_len], ids[req.prompt_len:], len(ids),
                                             spread)
        computed = {c.req_id: c.num_computed_tokens for c in step.cached}
        computed.update((r.req_id, r.num_computed_tokens) for r in step.new_requests)
        sampling = {r: computed[r] + n - 1 for r, n in step.num_scheduled_tokens.items()
                    if r in self.reqs and r in computed and computed[r] + n >= self.reqs[r].prefill_len}
        if not sampling or obs.step_failed() or obs.sampled is None:
            return prompt_rows
        handed = handed_to_scheduler(obs)
        spread = {r: p for r, p in sampling.items() if self.reqs[r].spread}
        out, flagged = check_grammar(index, step, obs.sampled, spread, handed)
        out += self._judge(index, obs, {r: p for r, p in spread.items() if r not in flagged}, handed,
                           step)
        out += check_logprobs(index, obs.sampled, self.reqs, sampling, handed, self.vocab_size,
                              step.grammar, step.spec_tokens)
        for req_id in sampling:
            self.reqs[req_id].outputs.extend(int(t) for t in handed.get(req_id, ()))
        out += self._histories(index, obs.sampled.get("history") or {}, sampling)
        return out + prompt_rows

    def _histories(self, index: int, stored: dict[str, Any], sampling: dict[str, int]) -> list[Finding]:
        """A request's stored history (``all_token_ids`` up to ``total_len``) is its prompt, then
        every token it was given: what penalties, bad words and drafters read, every step."""
        bad = []
        for req_id in sampling:
            got = stored.get(req_id)
            req = self.reqs[req_id]
            if got is not None and list(got) != req.prompt + req.outputs:
                bad.append((req_id, req.prompt + req.outputs, list(got)))
        if not bad:
            return []
        req_id, want, got = bad[0]
        at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        return [Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="sampling",
                        req_ids=tuple(r for r, _, _ in bad), field="req_states.all_token_ids",
                        expected=f"{len(want)} tokens, [{at}] = {want[at] if at < len(want) else None}",
                        actual=f"{len(got)} tokens, [{at}] = {got[at] if at < len(got) else None}",
                        message="a request's stored history (all_token_ids up to total_len) is its prompt "
                                "and every token it was given")]

    def _judge(self, index: int, obs: StepObs, sampling: dict[str, int], handed: dict[str, list],
               step: Step) -> list[Finding]:
        seen = obs.sampled
        if not sampling or not seen["calls"]:
            return []
        call = seen["calls"][-1]
        drafts = {r: self._drafts(r, pos, step) for r, pos in sampling.items()}
        made_up = step.placeholder_drafts()
        out: list[Finding] = []
        for row, req_id, pos in seen["rows"]:
            last = sampling.get(req_id)
            if last is None or row >= len(call.sampled) or not self.reqs[req_id].spread:
                continue
            req, j = self.reqs[req_id], pos - last + len(drafts[req_id])  # j: the row's draft index
            if j < 0 or pos < req.prefill_len - 1 or (j > 0 and req_id in made_up):
                # a row inside the prompt, or after a P/D step's placeholder draft: never sampled
                # from (a placeholder is "set to -1 so that the rejection kernels reject them")
                continue
            spec, allowed = req.spec or SamplingSpec(), step.grammar.get(req_id)
            logits = spread_logits(req_id, pos, self.vocab_size)
            history = [*req.outputs, *drafts[req_id][:j]]  # vLLM counts the step's earlier drafts
            want = expected_row(spec, logits, req.prompt, history, allowed)
            got = call.processed[row].astype(np.float64)
            problem = _row_problem(want, got)
            if problem and spec.top_p < 1.0 and not _row_problem(
                    expected_row(replace(spec, top_p=1.0), logits, req.prompt, history, allowed), got):
                # every stage but top-p holds: the cut itself is missing (one class, whatever the row)
                out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="sampling",
                                   req_ids=(req_id,), field="sampler.processed_logits", expected=TOP_P_CUT,
                                   actual=NO_TOP_P_CUT, message=f"the row sampled after position {pos}: top-p "
                                   f"{spec.top_p:.4g} cut nothing ({problem})"))
            elif problem:
                out.append(_finding(index, req_id, "sampler.processed_logits", problem,
                                    f"the row sampled after position {pos} under {_families(spec, allowed)}"))
            token = int(call.sampled[row])
            if token < 0 and j > 0:
                continue  # a row past the first rejected draft: nothing sampled from it
            # judged against the row it was drawn from (processing above is judged on its own)
            support = np.isfinite(got)
            best = np.max(got)
            if not np.isfinite(want.values).any():
                continue  # nothing may be sampled (a grammar allowing only masked tokens): no right token
            if not (0 <= token < len(support)) or not support[token] or (
                    want.greedy and got[token] < best - ATOL - RTOL * abs(best)):
                out.append(_finding(index, req_id, "sampler.sampled_token",
                                    f"expected a token of the row's support ({int(support.sum())} tokens"
                                    f"{', its argmax' if want.greedy else ''}), got {token}",
                                    "the sampled token lies inside its row's support"))
            elif req_id in handed and list(handed[req_id])[j:j + 1] != [token]:
                out.append(_finding(index, req_id, "output.sampled_token_ids",
                                    f"expected [{token}] at [{j}], got {list(handed[req_id])}",
                                    "the token handed to the scheduler is the one sampled for the request"))
        return out + self._kept(index, sampling, drafts, handed, step)

    def _drafts(self, req_id: str, last: int, step: Step) -> list[int]:
        """The drafts the drafter stand-in wrote for a spread request (simrig.sampling.drafts)."""
        k, req = step.spec_tokens.get(req_id, 0), self.reqs[req_id]
        if not k or not req.spread:
            return []
        return spread_drafts(req_id, req.spec or SamplingSpec(), req.prompt, req.outputs, last - k + 1, k,
                             rejected_from(step, req_id), self.vocab_size, step.grammar.get(req_id))

    def _kept(self, index: int, sampling: dict[str, int], drafts: dict[str, list[int]], handed: dict[str, list],
              step: Step) -> list[Finding]:
        """A spread request's drafts mean what the trace says: the kept ones handed out, then one token."""
        out = []
        for req_id, ids in drafts.items():
            kept = rejected_from(step, req_id)
            got = [int(t) for t in handed.get(req_id, ())]
            if ids and req_id in handed and (len(got) != kept + 1 or got[:kept] != ids[:kept]):
                out.append(_finding(index, req_id, "output.sampled_token_ids",
                                    f"the {kept} kept drafts {ids[:kept]} and one token, got {got}",
                                    "a greedy request's drafts are kept exactly where they are its rows' argmax"))
        return out


def _row_problem(want: Any, got: np.ndarray) -> str:
    """How the observed row differs from the expected one ('' when it does not)."""
    fin_want, fin_got = np.isfinite(want.values), np.isfinite(got)
    support = (fin_want != fin_got) & ~want.uncertain
    if support.any():
        t = int(np.flatnonzero(support)[0])
        return (f"support: expected {int(fin_want.sum())} tokens, got {int(fin_got.sum())} "
                f"(token {t}: expected {want.values[t]:.4g}, got {got[t]:.4g})")
    both = fin_want & fin_got
    diff = np.abs(got[both] - want.values[both]) > ATOL + RTOL * np.abs(want.values[both])
    if diff.any():
        t = int(np.flatnonzero(both)[np.flatnonzero(diff)[0]])
        return f"value: token {t} expected {want.values[t]:.6g}, got {got[t]:.6g}"
    return ""


def _families(spec: SamplingSpec, allowed: tuple[int, ...] | None = None) -> str:
    default = SamplingSpec()
    names = [f for f in ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                         "repetition_penalty", "logit_bias", "bad_words", "min_tokens")
             if getattr(spec, f) != getattr(default, f)]
    names += ["a grammar"] if allowed is not None else []
    return ", ".join(names) or "its parameters"


def _finding(index: int, req_id: str, field_name: str, detail: str, message: str) -> Finding:
    expected, _, actual = detail.partition(", got ")
    return Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="sampling",
                   req_ids=(req_id,), field=field_name, expected=expected, actual=actual,
                   message=f"{message}: {detail}")
