"""The sampling rows of a campaign's axes table: which parameter families and schedules it drew.

Each row is recognised from what the scheduler sent (a Step, read by its attribute names:
this room stands under the step model and imports none of it), each scheduled row's
(request, computed tokens before the step, prefill length, tokens scheduled) and what earlier
steps of the same example held::

    step i ──► SamplingAxisState (live specs, requests with parameters that left, where each
               seeded request sampled, seeded ids preempted) ──► drawn rows

``simrig/campaign/axes.py`` lists these rows after its own (the axes table: docs/fuzz.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simrig.sampling.params import SamplingSpec

Row = tuple[str, int, int, int]  # (request, computed before the step, its prefill length, scheduled)

# (row name, what it means, whether a spec has it): a family is drawn on a step that
# schedules a request whose spec has it.
FAMILIES: tuple[tuple[str, str, Callable[[SamplingSpec], bool]], ...] = (
    ("sampling: temperature", "a temperature other than 1 (0: greedy)", lambda s: s.temperature != 1.0),
    ("sampling: top-k", "a top-k cut (not 0 or -1)", lambda s: s.top_k not in (0, -1)),
    ("sampling: top-p", "a top-p below 1", lambda s: s.top_p < 1.0),
    ("sampling: min-p", "a min-p above 0", lambda s: s.min_p > 0.0),
    ("sampling: seed", "an explicit seed", lambda s: s.seed is not None),
    ("sampling: penalties", "a presence, frequency or repetition penalty",
     lambda s: (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) != (0.0, 0.0, 1.0)),
    ("sampling: logit bias", "a logit bias", lambda s: bool(s.logit_bias)),
    ("sampling: bad words", "bad words", lambda s: bool(s.bad_words)),
    ("sampling: min_tokens", "min_tokens above 0 (stop ids masked until then)", lambda s: s.min_tokens > 0),
    ("sampling: logprobs", "sample logprobs", lambda s: s.logprobs is not None),
    ("sampling: prompt logprobs", "prompt logprobs", lambda s: s.prompt_logprobs is not None),
)


def _asks(spec: SamplingSpec | None) -> bool:
    return spec is not None and not spec.is_default


@dataclass
class SamplingAxisState:
    """What one example held of its requests' sampling before the step being looked at."""

    specs: dict[str, SamplingSpec | None] = field(default_factory=dict)  # live id -> its spec
    asking_left: int = 0  # requests with parameters that finished or were preempted
    positions: dict[str, set[int]] = field(default_factory=dict)  # seeded id -> batch positions it sampled at
    preempted_seeded: set[str] = field(default_factory=set)  # seeded ids preempted, not sent again yet

    def spec(self, step: Any, req_id: str) -> SamplingSpec | None:
        new = next((n for n in step.new_requests if n.req_id == req_id), None)
        return new.sampling if new is not None else self.specs.get(req_id)

    def has(self, test: Callable[[SamplingSpec], bool], step: Any, rows: list[Row]) -> bool:
        return any(_asks(s := self.spec(step, r)) and test(s) for r, *_ in rows)

    def slot_reuse(self, step: Any, rows: list[Row]) -> bool:
        """A request with parameters arrives after one with parameters left: the slot it may
        take held that other request's sampling state (bad words, penalty counts, bias)."""
        leaving = sum(_asks(self.specs.get(r)) for r in [*step.finished, *step.preempted])
        return self.asking_left + leaving > 0 and any(
            _asks(n.sampling) and not n.streaming for n in step.new_requests)

    def _seeded_samples(self, step: Any, rows: list[Row]) -> list[tuple[str, int]]:
        """(seeded request, its batch position as the step lists it) for each row that samples."""
        return [(r, i) for i, (r, computed, prefill, n) in enumerate(rows)
                if computed + n >= prefill and (s := self.spec(step, r)) is not None and s.seed is not None]

    def seed_moved(self, step: Any, rows: list[Row]) -> bool:
        """A seeded request samples at a batch position other than one it sampled at before:
        its tokens must not depend on where it sits."""
        return any(self.positions.get(r, {i}) != {i} for r, i in self._seeded_samples(step, rows))

    def seed_resumed(self, step: Any, rows: list[Row]) -> bool:
        return any(n.req_id in self.preempted_seeded for n in step.new_requests) or any(
            c.resumed and c.req_id in self.preempted_seeded for c in step.cached)

    def prompt_logprobs_chunked(self, step: Any, rows: list[Row]) -> bool:
        """A request asking prompt logprobs has a part of its prompt scheduled, not all of it."""
        return any(computed < prefill and (computed > 0 or computed + n < prefill)
                   and (s := self.spec(step, r)) is not None and s.prompt_logprobs is not None
                   for r, computed, prefill, n in rows)

    def advance(self, step: Any, rows: list[Row]) -> None:
        for r, i in self._seeded_samples(step, rows):
            self.positions.setdefault(r, set()).add(i)
        for r in [*step.finished, *step.preempted]:
            spec = self.specs.pop(r, None)
            self.asking_left += _asks(spec)
            if r in step.preempted and spec is not None and spec.seed is not None:
                self.preempted_seeded.add(r)
        for r in step.finished:
            self.positions.pop(r, None)
        self.preempted_seeded -= {c.req_id for c in step.cached if c.resumed}
        for new in step.new_requests:
            self.specs[new.req_id] = new.sampling
            self.preempted_seeded.discard(new.req_id)


def grammar_out_of_order(step: Any, rows: list[Row]) -> bool:
    """The step's grammar requests (``step.grammar``, in the scheduler's order) are listed in an
    order other than the runner's batch, which puts fewer scheduled tokens first (decodes, then
    short extends, then prefills; ties as the step lists them)."""
    grammar = getattr(step, "grammar", None)  # a Step without the field: no grammar
    listed = [r for r in grammar or () if r in step.num_scheduled_tokens]
    order = {r: (n, i) for i, (r, _, _, n) in enumerate(rows)}
    return listed != sorted(listed, key=order.__getitem__)


Test = Callable[[SamplingAxisState, Any, list[Row]], bool]
# (row name, what it means, its test): the families, then the schedules
ROWS: tuple[tuple[str, str, Test], ...] = (
    *((name, what, lambda st, step, rows, t=test: st.has(t, step, rows)) for name, what, test in FAMILIES),
    ("sampled slot reuse", "a request with parameters admitted after another with parameters left",
     SamplingAxisState.slot_reuse),
    ("seed at another batch position", "a seeded request sampled at a batch position other than before",
     SamplingAxisState.seed_moved),
    ("seeded resumption", "a seeded request preempted and resumed", SamplingAxisState.seed_resumed),
    ("prompt logprobs over chunks", "a request asking prompt logprobs with its prompt chunked",
     SamplingAxisState.prompt_logprobs_chunked),
    ("grammar out of batch order", "a step listing its grammar requests in another order than the runner's batch",
     lambda st, step, rows: grammar_out_of_order(step, rows)),
    ("grammar under drafts", "a grammar request verifying drafts: its set masks each draft row",
     lambda st, step, rows: any(step.spec_tokens.get(r, 0) > 0 for r in getattr(step, "grammar", None) or ())),
)
