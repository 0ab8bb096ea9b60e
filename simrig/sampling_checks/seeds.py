"""Seeds: a request with an explicit seed gets the same tokens whatever its schedule.

``SeedsRecord`` follows a run's seeded spread requests (temperature > 0, no grammar, no
drafts, no streaming update): each life's prompt and the tokens vLLM's sampler gave it,
across preemptions (a resumed request re-sends them; its positions stay the same). At the
end of the run each such request replays ALONE on a runner of the same config
(``solo_steps``: its prompt in budget-sized chunks, then one token per step) and its tokens
are compared position by position: a metamorphic check that needs no model of vLLM's
random numbers (vLLM's ``gumbel_noised_argmax``: "``pos`` and ``seed`` place the draw in
the request's stream"). A difference is one value_mismatch at postprocess, field
sampler.seeded_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.observe import LIFECYCLE, POSTPROCESS, StepObs, handed_to_scheduler
from simrig.sampling.logits import spreads
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step, step_block_ids

FIELD = "sampler.seeded_tokens"
PLACEHOLDER = "seeds-placeholder"


@dataclass
class _Life:
    first: NewRequest  # its first arrival: prompt, parameters, adapter
    prefill_len: int  # what the current arrival hands the runner (prompt + outputs when resumed)
    tokens: list[tuple[int, int]] = field(default_factory=list)  # (step index, token) given, in order
    slots: set[int] = field(default_factory=set)  # the runner's slots it sampled in


class SeedsRecord:
    """The seeded spread requests of one run and the tokens each was given."""

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.live: dict[str, _Life] = {}
        self.done: list[_Life] = []
        self._preempted: set[str] = set()
        self.spoilt = False  # a step failed (or the run ends on a finding): no solo replays
        self.where: Any = None  # where the run's last step was (a campaign's class tally)

    def observe(self, index: int, step: Step, obs: StepObs | None) -> SeedsRecord:
        """Learn what ``step`` added, preempted and finished, and the tokens it handed out."""
        if self.spoilt or obs is None or obs.step_failed():
            self.spoilt = True
            return self
        for req_id in step.finished:
            self._end(req_id)
        self._preempted.update(step.preempted)
        for req in step.new_requests:
            life = self.live.get(req.req_id)
            if req.req_id in self._preempted and life is not None:
                life.prefill_len = req.num_prefill_tokens  # resumed: the same life goes on
            else:
                self._end(req.req_id)
                if self._seeded(req):
                    self.live[req.req_id] = _Life(req, req.num_prefill_tokens)
            self._preempted.discard(req.req_id)
        computed = {c.req_id: c.num_computed_tokens for c in step.cached}
        computed.update((r.req_id, r.num_computed_tokens) for r in step.new_requests)
        handed, slots = handed_to_scheduler(obs), _slots(obs)
        for req_id, n in step.num_scheduled_tokens.items():
            life = self.live.get(req_id)
            if life is not None and req_id in computed and computed[req_id] + n >= life.prefill_len:
                life.tokens += [(index, int(t)) for t in handed.get(req_id, ())]
                life.slots.add(slots.get(req_id, -1))
        return self

    def _seeded(self, req: NewRequest) -> bool:
        spec = req.sampling
        return (spec is not None and spec.seed is not None and spec.temperature != 0.0 and not req.streaming
                and not req.structured_output and not self.config.num_speculative_tokens
                and spreads(spec, 0, False))

    def _end(self, req_id: str) -> None:
        life = self.live.pop(req_id, None)
        if life is not None and life.tokens:
            self.done.append(life)

    def lives(self) -> list[_Life]:
        """Every seeded spread request that was given a token, finished or not."""
        if self.spoilt:
            return []
        return self.done + [life for life in self.live.values() if life.tokens]

    def check(self, runners: Any, stages: Any) -> list[Finding]:
        """Each request replayed alone on ``runners.acquire(config, stages)``; its differences."""
        out = []
        for life in self.lives():
            run = [t for _, t in life.tokens]
            # a fresh runner hands out its last slot first: where the request sampled only
            # there, a placeholder neighbour takes it so the solo schedule differs in slot too
            shift = life.slots == {self.config.max_num_reqs - 1} and self.config.max_num_reqs > 1
            alone = solo_tokens(runners, stages, self.config, life.first, len(run), shift)
            if alone is None:
                continue  # the solo run failed: the checks of its own steps say why
            at = next((i for i, (a, b) in enumerate(zip(alone, run)) if a != b), None)
            if at is not None:
                out.append(_finding(life, at, alone[at], run[at]))
        return out


def solo_steps(config: RunnerConfig, req: NewRequest, num_tokens: int, shift: bool = False) -> list[Step]:
    """``req`` alone on a fresh runner: its prompt in chunks of the token budget, then one
    token per step, until it has been given ``num_tokens`` tokens. ``shift``: a one-token
    request without parameters (``PLACEHOLDER``) arrives first, in the first step only, and
    takes the slot the runner hands out first."""
    groups, start = [], 1  # block 0 is the null block
    for g in range(config.num_kv_groups):
        groups.append(list(range(start, start + config.blocks_per_request(g))))
        start += config.blocks_per_request(g)
    budget, prompt = config.max_num_batched_tokens, req.prompt_len
    first = NewRequest(req.req_id, prompt, max_tokens=req.max_tokens, prompt_token_ids=req.prompt_token_ids,
                       block_ids=step_block_ids(groups), lora_id=req.lora_id, sampling=req.sampling)
    steps = [Step(new_requests=[first], num_scheduled_tokens={req.req_id: min(budget - shift, prompt)})]
    if shift:
        steps[0].new_requests.insert(0, NewRequest(PLACEHOLDER, 1, max_tokens=1, block_ids=step_block_ids(
            [[start + g] for g in range(config.num_kv_groups)])))
        steps[0].num_scheduled_tokens = {PLACEHOLDER: 1, **steps[0].num_scheduled_tokens}
    for done in range(min(budget - shift, prompt), prompt, budget):
        steps.append(Step(cached=[CachedUpdate(req.req_id, done)],
                          num_scheduled_tokens={req.req_id: min(budget, prompt - done)}))
    for k in range(num_tokens - 1):
        steps.append(Step(cached=[CachedUpdate(req.req_id, prompt + k)],
                          num_scheduled_tokens={req.req_id: 1}))
    if shift and len(steps) > 1:
        steps[1].finished.append(PLACEHOLDER)
    return steps


def solo_tokens(runners: Any, stages: Any, config: RunnerConfig, req: NewRequest, num_tokens: int,
                shift: bool = False) -> list[int] | None:
    """The tokens ``req`` is given on ``solo_steps`` (None: a solo step failed)."""
    harness, got = runners.acquire(config, stages), []
    try:
        for step in solo_steps(config, req, num_tokens, shift):
            obs = harness.run_step(step)
            if obs.step_failed():
                return None
            got += [int(t) for t in handed_to_scheduler(obs).get(req.req_id, ())]
    finally:
        runners.release(harness)
    return got[:num_tokens]


def _slots(obs: StepObs) -> dict[str, int]:
    """Each live request's slot after the step's lifecycle (``runner.live_ids``, ``live_slots``)."""
    fields = getattr(obs.get(LIFECYCLE), "fields", {})
    ids, slots = fields.get("runner.live_ids"), fields.get("runner.live_slots")
    return dict(zip(ids.values, slots.values)) if ids is not None and slots is not None else {}


def _finding(life: _Life, at: int, alone: int, run: int) -> Finding:
    req = life.first
    return Finding(kind=fk.VALUE_MISMATCH, step=life.tokens[at][0], stage=POSTPROCESS, check="sampling",
                   req_ids=(req.req_id,), field=FIELD, expected=f"[{at}] = {alone} (as replayed alone)",
                   actual=f"[{at}] = {run} (in the run)",
                   message=f"a request with seed {req.sampling.seed} was given another token at output {at} "
                           "in the run than alone: vLLM's Gumbel-max sampling keys each draw by the "
                           "request's seed and the token's position (gumbel_noised_argmax: \"pos and "
                           "seed place the draw in the request's stream\"), never by its slot or its "
                           "neighbours")
