"""Which request features a campaign drew, and how soon: the axes table of its report.

A nightly owner reads a clean campaign as "nothing is wrong" only if the campaign reached
the features that could be wrong. Each axis is recognised from what the scheduler sent
(the Step), the config it ran under and what earlier steps of the same example held::

    example k, step i ──► AxisState (live ids, their adapters, adapters freed) ──► drawn axes
                                                                                 │
    AxisTally: per axis, the first drawn (seconds into the campaign), steps, examples

The table is in every campaign report (``axes.csv``; the page's "Axes drawn" section) and
its counts in summary.json (``axes``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simrig.sampling.axes import ROWS as SAMPLING_ROWS
from simrig.sampling.axes import SamplingAxisState
from simrig.step import RunnerConfig, Step


@dataclass
class AxisState:
    """What one example held before the step being looked at."""

    adapters: dict[str, int | None] = field(default_factory=dict)  # live id -> its LoRA adapter
    freed_adapters: set[int | None] = field(default_factory=set)  # adapters of requests that left
    preempted: set[str] = field(default_factory=set)  # ids preempted and not sent again yet
    computed: dict[str, int] = field(default_factory=dict)  # live id -> tokens computed
    prefill: dict[str, int] = field(default_factory=dict)  # live id -> tokens of its prefill
    sampling: SamplingAxisState = field(default_factory=SamplingAxisState)  # simrig/sampling/axes.py

    def before(self, step: Step) -> dict[str, int]:
        """Each scheduled request's computed tokens as the step starts (the scheduler's own
        count where the step carries one)."""
        computed = dict(self.computed)
        computed.update({c.req_id: c.num_computed_tokens for c in step.cached})
        computed.update({n.req_id: n.num_computed_tokens for n in step.new_requests})
        return {r: computed.get(r, 0) for r in step.num_scheduled_tokens}

    def prefill_of(self, step: Step, req_id: str) -> int:
        new = next((n for n in step.new_requests if n.req_id == req_id), None)
        return new.num_prefill_tokens if new is not None else self.prefill.get(req_id, 0)

    def advance(self, step: Step) -> None:
        self.sampling.advance(step, _rows(step, self))
        before = self.before(step)
        for req_id in [*step.finished, *step.preempted]:
            if req_id in self.adapters:
                self.freed_adapters.add(self.adapters.pop(req_id))
            self.computed.pop(req_id, None)
            self.prefill.pop(req_id, None)
        self.preempted |= set(step.preempted)
        for new in step.new_requests:
            self.adapters[new.req_id] = new.lora_id
            self.prefill[new.req_id] = new.num_prefill_tokens
            self.preempted.discard(new.req_id)
        for req_id, start in before.items():
            if req_id in self.adapters:
                self.computed[req_id] = start + step.num_accepted(req_id)


@dataclass(frozen=True)
class Axis:
    name: str
    what: str
    drawn: Callable[[RunnerConfig, Step, AxisState], bool]


def _config(attr: str, above: int = 1) -> Callable[[RunnerConfig, Step, AxisState], bool]:
    return lambda config, step, state: getattr(config, attr) > above


def _rows(step: Step, state: AxisState) -> list[tuple[str, int, int, int]]:
    """(request, computed before the step, its prefill length, tokens scheduled) per row."""
    before = state.before(step)
    return [(r, before[r], state.prefill_of(step, r), n) for r, n in step.num_scheduled_tokens.items()]


def _final_chunk_with_drafts(config: RunnerConfig, step: Step, state: AxisState) -> bool:
    return bool(step.spec_tokens) and any(
        r not in step.spec_tokens and computed < prefill <= computed + n for r, computed, prefill, n in _rows(step, state))


def _fewer_drafts_than_k(config: RunnerConfig, step: Step, state: AxisState) -> bool:
    k = config.num_speculative_tokens
    return bool(step.spec_tokens) and any(
        computed >= prefill and step.spec_tokens.get(r, 0) < k for r, computed, prefill, _ in _rows(step, state))


def _placeholder_drafts(config: RunnerConfig, step: Step, state: AxisState) -> bool:
    """P/D: a request sent with one prompt token left carries drafts the scheduler made up."""
    return any(r in step.spec_tokens and computed < prefill for r, computed, prefill, _ in _rows(step, state))


def _lora_slot_reuse(config: RunnerConfig, step: Step, state: AxisState) -> bool:
    """A request arrives after one with another adapter (or none) left: the slot it may take
    held that other adapter."""
    return config.max_loras > 0 and any(
        state.freed_adapters - {new.lora_id} for new in step.new_requests)


def _streaming_update(config: RunnerConfig, step: Step, state: AxisState) -> bool:
    return any(new.streaming and new.req_id in state.adapters for new in step.new_requests)


def _resumption(config: RunnerConfig, step: Step, state: AxisState) -> bool:
    return any(c.resumed for c in step.cached) or any(new.req_id in state.preempted for new in step.new_requests)


AXES: tuple[Axis, ...] = (
    Axis("PCP > 1", "prefill context parallel: every rank partitioned", _config("pcp_size")),
    Axis("DCP > 1", "decode context parallel: KV sharded", _config("dcp_size")),
    Axis("PP > 1", "pipeline ranks: the non-last rank's path", _config("pp_size")),
    Axis("micro-batches", "DBO: the batch split into micro-batches", _config("num_ubatches")),
    Axis("graph mode", "a captured cudagraph mode (FULL, PIECEWISE, ...)",
         lambda c, s, st: c.cudagraph_mode != "NONE"),
    Axis("drafts", "speculative drafts scheduled", lambda c, s, st: bool(s.spec_tokens)),
    Axis("drafts + final prefill chunk", "a spec-decode batch that also finishes a prefill",
         _final_chunk_with_drafts),
    Axis("fewer drafts than K", "a decode row with fewer drafts than num_speculative_tokens",
         _fewer_drafts_than_k),
    Axis("rejections", "drafts the sampler rejected", lambda c, s, st: bool(s.rejected)),
    Axis("vLLM's rejection sampler", "drafts verified by vLLM's own sampler (standard or block)",
         lambda c, s, st: bool(s.spec_tokens) and c.rejection_sampler != ""),
    Axis("placeholder drafts", "P/D first step: placeholder (-1) drafts", _placeholder_drafts),
    Axis("preemption", "a running request preempted", lambda c, s, st: bool(s.preempted)),
    Axis("resumption", "a preempted request resumed", _resumption),
    Axis("LoRA", "a request with an adapter", lambda c, s, st: any(n.lora_id for n in s.new_requests)),
    Axis("LoRA slot reuse", "a request admitted after one with another adapter (or none) left",
         _lora_slot_reuse),
    Axis("streaming update", "a new request with a live id (streaming input)", _streaming_update),
    Axis("sliding window", "a sliding-window KV cache group",
         lambda c, s, st: any(g.kind == "sliding_window" for g in c.kv_groups)),
    *(Axis(name, what, lambda c, s, st, test=test: test(st.sampling, s, _rows(s, st)))
      for name, what, test in SAMPLING_ROWS),
)


@dataclass
class AxisTally:
    """Per axis: seconds into the campaign it was first drawn, steps and examples drawing it."""

    first_s: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)
    last_example: dict[str, int] = field(default_factory=dict)  # examples run in order: count changes

    def observe(self, config: RunnerConfig, step: Step, state: AxisState, *, elapsed_s: float,
                example: int) -> None:
        for axis in AXES:
            if axis.drawn(config, step, state):
                name = axis.name
                self.first_s.setdefault(name, round(elapsed_s, 3))
                self.steps[name] = self.steps.get(name, 0) + 1
                if self.last_example.get(name) != example:
                    self.last_example[name] = example
                    self.examples[name] = self.examples.get(name, 0) + 1
        state.advance(step)

    def merge(self, other: AxisTally) -> None:
        """Add another shard's tally (each shard's clock starts with the campaign's)."""
        for name, first in other.first_s.items():
            self.first_s[name] = min(first, self.first_s.get(name, first))
        for mine, theirs in ((self.steps, other.steps), (self.examples, other.examples)):
            for name, n in theirs.items():
                mine[name] = mine.get(name, 0) + n

    def summary(self) -> dict[str, dict[str, Any]]:
        return {a.name: {"first_s": self.first_s.get(a.name), "steps": self.steps.get(a.name, 0),
                         "examples": self.examples.get(a.name, 0)} for a in AXES}

    def frame(self) -> Any:
        import pandas as pd  # the report's dependency, not the step loop's

        def first(name: str) -> str:  # a string column: "never" reads better than NaN
            return f"{self.first_s[name]:.1f}" if name in self.first_s else "never"

        return pd.DataFrame([{"axis": a.name, "what": a.what, "first drawn (s)": first(a.name),
                              "steps": self.steps.get(a.name, 0), "examples": self.examples.get(a.name, 0)}
                             for a in AXES])
