"""Crash classes made smaller: greedy delta debugging, each candidate replayed in a forked child.

A ``crash`` class keeps the example that killed a campaign's worker, up to the step that died
(``simrig.supervision.campaign_worker``); Hypothesis cannot shrink it, for every candidate would
kill its worker. ``CrashShrinker`` drops whole requests, then runs of earlier steps (the tokens a
dropped step computed are taken off the request's later steps, a request it added arrives at its
next step), and keeps a candidate only when it is a valid schedule (the trace reader and
``SchedulerContract`` accept it) whose replay in a forked child
(``simrig.campaign.shrink.replays_to_a_crash``) dies as the class did; a crashing replay also
cuts the steps after the one that died. At most ``MAX_REPLAYS`` replays per class; a hang is kept.

See docs/fuzz.md, 'After a crash: the campaign goes on'.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from simrig.campaign.shrink import replays_to_a_crash, shrunk_header
from simrig.checks.lifecycle import SchedulerContract
from simrig.step import NewRequest, Step, block_groups, step_block_ids
from simrig.trace_io.trace import TraceError, read_trace, write_trace

MAX_REPLAYS = 32  # per crash class, the first replay (the example itself) included; about a second each
CANDIDATE_TIMEOUT_S = 60.0  # a candidate opening no stage for this long hangs: not the class's crash

# A schedule: its steps, and the violation each contract-breaking step carries (adversarial mode).
Schedule = tuple[list[Step], dict[int, str]]


def shrink_crash_classes(campaign: Any, max_replays: int = MAX_REPLAYS) -> None:
    """Each crash class of ``campaign`` with an example not shrunk yet: its steps replaced by the
    smallest schedule found that still crashes, ``example_steps`` set to the example's length;
    one line on stderr says what each became."""
    for cls in sorted(campaign.classes.values(), key=lambda c: c.key):
        if cls.key[0] != "crash" or not cls.steps or cls.source != "campaign" or cls.example_steps >= 0:
            continue
        cls.example_steps, requests = len(cls.steps), len(request_ids(cls.steps))
        if cls.key[3] == "hang":  # each candidate that hangs too would cost the whole timeout
            note = f"kept {len(cls.steps)} steps (a hang is not shrunk)"
        else:
            shrinker = CrashShrinker(cls, campaign.options, max_replays)
            cls.steps, cls.violations = shrinker.run()
            note = shrinker.note or (f"shrunk {cls.example_steps} -> {len(cls.steps)} steps, {requests} -> "
                                     f"{len(request_ids(cls.steps))} requests")
            note += f" ({shrinker.replays} replay(s) in forked children, at most {max_replays})"
        print(f"simrig fuzz: {' · '.join(p for p in cls.key[:4] if p)}: {note}", file=sys.stderr)


class CrashShrinker:
    """One crash class's schedule, shrunk by replays (see the module docstring)::

        the example ──► valid? ──► replay: dies as the class did, at step d? ──► cut after d
          ├─ drop whole requests: all those the last step does not hold, then one at a time
          └─ drop runs of steps before the last: halves, quarters, ... single steps
        each candidate: valid (reader, contract) ──► replay ──► same crash: kept, cut after d

    ``note`` says why the example was kept whole (None when it was shrunk, if only by nothing).
    """

    def __init__(self, cls: Any, options: Any, max_replays: int = MAX_REPLAYS,
                 timeout_s: float = CANDIDATE_TIMEOUT_S) -> None:
        self.cls, self.options = cls, options
        self.max_replays, self.timeout_s = max_replays, timeout_s
        self.replays = 0
        self.note: str | None = None
        # PP: a step that schedules nothing keeps a request's pp_size steps between its decodes
        self.pp = cls.config.pp_size > 1
        self._path = Path()

    def run(self) -> Schedule:
        """The smallest schedule found (the example itself when nothing smaller crashes)."""
        example: Schedule = (list(self.cls.steps), dict(self.cls.violations))
        if self.valid(example) is None:
            self.note = f"kept {len(example[0])} steps (it fails the checks every candidate must pass)"
            return example
        with tempfile.TemporaryDirectory(prefix="simrig-crash-shrink-") as folder:
            self._path = Path(folder) / "candidate.jsonl"
            best = self.attempt(example)
            if best is None:
                self.note = (f"kept {len(example[0])} steps (a forked child replaying them did not "
                             "die as the worker did)")
                return example
            best = self._drop_requests(best)
            if not self.pp:
                best = self._drop_steps(best)
        return best

    def attempt(self, candidate: Schedule | None) -> Schedule | None:
        """``candidate`` cut after the step that died, when it is valid and its replay dies as
        the class did; None when not, or when no replay is left."""
        checked = self.valid(candidate) if candidate is not None else None
        if checked is None or self.replays >= self.max_replays:
            return None
        steps, violations = checked
        header = shrunk_header(replace(self.cls, steps=steps, violations=violations), self.options)
        write_trace(self._path, header, steps)
        try:
            read_trace(self._path)  # the reader's own rules: ids, bounds
        except TraceError:
            return None
        self.replays += 1
        died = replays_to_a_crash(self._path, self.options.stages, self.cls.key, self.timeout_s)
        if died is None:
            return None
        last = max(died.step, 0) + 1  # -1: died building the runner, before the first step
        return steps[:last], {i: v for i, v in violations.items() if i < last}

    def valid(self, schedule: Schedule) -> Schedule | None:
        """``schedule`` with the violations its steps still carry, when it has a step, every step
        that breaks the scheduler contract carries one and drafts go only to requests whose prefill
        is done once the step's own tokens are (decodes; placeholder drafts on a prefill's last
        token); None when not."""
        steps, violations = schedule
        if not steps:
            return None
        contract = SchedulerContract(self.cls.config)
        kept = {}
        for i, step in enumerate(steps):
            computed = {c.req_id: c.num_computed_tokens for c in step.cached}
            computed.update({r.req_id: r.num_computed_tokens for r in step.new_requests})
            prefill = {**contract.prefill_len, **{r.req_id: r.num_prefill_tokens for r in step.new_requests}}
            if any(k and computed.get(r, 0) + step.num_scheduled_tokens.get(r, 0) - k < prefill.get(r, 0)
                   for r, k in step.spec_tokens.items()):
                return None
            if contract.violations(step):
                if i not in violations:
                    return None
                kept[i] = violations[i]
        return steps, kept

    def _drop_requests(self, best: Schedule) -> Schedule:
        last = best[0][-1]
        held = set(last.num_scheduled_tokens) | {r.req_id for r in last.new_requests}
        others = [r for r in request_ids(best[0]) if r not in held]
        groups = ([others] if len(others) > 1 else []) + [[r] for r in others] + \
            [[r] for r in request_ids(best[0]) if r in held]
        for group in groups:
            if self.replays >= self.max_replays:
                break
            gone = [r for r in group if r in request_ids(best[0])]
            candidate = best
            for req_id in gone:
                candidate = without_request(candidate, req_id, keep_empty=self.pp)
            if gone:
                best = self.attempt(candidate) or best
        return best

    def _drop_steps(self, best: Schedule) -> Schedule:
        size, groups = max((len(best[0]) - 1) // 2, 1), self.cls.config.num_kv_groups
        while self.replays < self.max_replays:
            start = 0
            while start < len(best[0]) - 1 and self.replays < self.max_replays:
                end = min(start + size, len(best[0]) - 1)
                candidate: Schedule | None = best
                for i in range(end - 1, start - 1, -1):  # the highest first: lower indices stay put
                    candidate = without_step(candidate, i, groups) if candidate else None
                found = self.attempt(candidate)
                if found is None:
                    start = end
                else:
                    best = found  # the steps after the run slid into its place: try them next
            if size == 1:
                break
            size = max(size // 2, 1)
        return best


def request_ids(steps: list[Step]) -> list[str]:
    """Every request id a schedule names, in the order it first appears."""
    seen: dict[str, None] = {}
    for s in steps:
        for req_id in (*s.finished, *s.preempted, *(r.req_id for r in s.new_requests),
                       *(c.req_id for c in s.cached), *s.num_scheduled_tokens):
            seen.setdefault(req_id, None)
    return list(seen)


def without_request(schedule: Schedule, req_id: str, keep_empty: bool = False) -> Schedule:
    """``schedule`` as if request ``req_id`` never came: gone from every step; a step that then
    schedules and reports nothing is dropped too (kept with ``keep_empty``: PP's interval)."""
    steps, violations = schedule
    out: list[Step] = []
    kept: dict[int, str] = {}
    for i, s in enumerate(steps):
        t = Step(new_requests=[r for r in s.new_requests if r.req_id != req_id],
                 cached=[c for c in s.cached if c.req_id != req_id],
                 num_scheduled_tokens={k: v for k, v in s.num_scheduled_tokens.items() if k != req_id},
                 spec_tokens={k: v for k, v in s.spec_tokens.items() if k != req_id},
                 rejected={k: v for k, v in s.rejected.items() if k != req_id},
                 finished=[r for r in s.finished if r != req_id],
                 preempted=[r for r in s.preempted if r != req_id], idle_dummy=s.idle_dummy)
        if keep_empty or t.num_scheduled_tokens or t.finished or t.preempted:
            if i in violations:
                kept[len(out)] = violations[i]
            out.append(t)
    return out, kept


def without_step(schedule: Schedule, index: int, num_kv_groups: int = 1) -> Schedule | None:
    """``schedule`` without step ``index`` (never the last) and still continuous::

        a request it scheduled    its later cached updates count the tokens it accepted less
        a request it added        arrives at its next cached update instead (that update's
                                  computed tokens, its blocks and that update's new ones);
                                  one finished or preempted before then never arrives
        its finished, preempted   reported by the next step
    """
    steps, violations = schedule
    if index >= len(steps) - 1:
        return None
    steps = copy.deepcopy(steps)
    gone, rest = steps[index], steps[index + 1:]
    for req_id in gone.num_scheduled_tokens:
        accepted = gone.num_accepted(req_id)
        for s in rest:
            if req_id in (*s.finished, *s.preempted, *(r.req_id for r in s.new_requests)):
                break  # this incarnation of the request ends here
            for c in s.cached:
                if c.req_id == req_id:
                    c.num_computed_tokens -= accepted
    for new in gone.new_requests:
        _arrive_later(rest, new, num_kv_groups)
    rest[0].finished[:0] = [r for r in gone.finished if r not in rest[0].finished]
    rest[0].preempted[:0] = [r for r in gone.preempted if r not in rest[0].preempted]
    shifted = {i - (i > index): v for i, v in violations.items() if i != index}
    return steps[:index] + rest, shifted


def _arrive_later(rest: list[Step], new: NewRequest, num_kv_groups: int) -> None:
    for s in rest:
        for names in (s.finished, s.preempted):
            if new.req_id in names:
                names.remove(new.req_id)
                return
        if any(r.req_id == new.req_id for r in s.new_requests):
            return
        for k, c in enumerate(s.cached):
            if c.req_id == new.req_id:
                del s.cached[k]
                blocks = [a + b for a, b in zip(block_groups(new.block_ids, num_kv_groups),
                                                block_groups(c.new_block_ids, num_kv_groups))]
                s.new_requests.append(replace(new, num_computed_tokens=c.num_computed_tokens,
                                              block_ids=step_block_ids(blocks)))
                return
