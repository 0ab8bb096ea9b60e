"""``SchedulerContractMachine``: Hypothesis plays the scheduler against the real runner.

    rules (scheduler side, strategies.model)        after every scheduled step
    ───────────────────────────────────────         ───────────────────────────────────────
    arrive / abort / preempt / resume /      ──►    Harness.run_step(step)   (real MRV2 code)
      stream_input (streaming sessions)
    schedule (prefill chunk, decode, spec)          Checker.check + extra checks
    adversarial only: unknown_id, finished_id,      fail on any finding the settings call
      unknown_cached, duplicate_new                 "failing" -> NewFinding(steps, findings)

Mode ``valid`` never breaks the contract, so any finding is a runner (or rig)
bug. Mode ``adversarial`` also sends contract violations, each as a step of
its own; the runner must reject them loudly. A KeyError (or a Checker
contract_violation_input) on such a step is a *loud rejection*: the expected
behaviour, still recorded as a finding class. A violation that no stage
raises on is a ``silent_acceptance``.

Every Step the machine sends is recorded with its violation tag, so a failing
example becomes a v1 trace that ``simrig replay`` reproduces.

    Machine = SchedulerContractMachine.bind(MachineSettings(mode="adversarial"))
    run_state_machine_as_test(Machine, settings=settings(max_examples=20))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from simrig.checks.checker import (  # noqa: F401  (re-exported)
    ExtraCheck,
    check_step,
    is_loud_rejection,
    runner_error_findings,
    silent_acceptance_finding,
)
from simrig.checks.lifecycle import (  # noqa: F401  (re-exported)
    DUPLICATE_NEW,
    FINISHED_ID,
    LOUD_KINDS,
    UNKNOWN_CACHED,
    UNKNOWN_ID,
    VIOLATIONS,
)
from simrig.findings.findings import Finding
from simrig.observe import OPTIONAL_STAGES, StepObs
from simrig.step import CachedUpdate, RunnerConfig, Step
from strategies._validate import check_choice, check_strategy
from strategies.blocks import tokens_per_block
from strategies.configs import runner_configs
from strategies.grammar import grammar_sizes
from strategies.model import Plan, Row, SchedulerModel
from strategies.requests import lora_ids, prefix_cache_hits, prompt_lengths
from strategies.sampling import request_sampling, within_max_tokens
from strategies.steps import draw_large_plan, draw_plan, draw_small_plan, draw_stream_input

MODES = ("valid", "adversarial")


@dataclass
class MachineSettings:
    """How a machine class runs; bind with ``SchedulerContractMachine.bind``."""

    mode: str = "valid"
    configs: st.SearchStrategy[RunnerConfig] = field(default_factory=runner_configs)
    stages: Sequence[str] = OPTIONAL_STAGES
    extra_checks: Sequence[ExtraCheck] = ()
    violations: Sequence[str] = VIOLATIONS
    max_new_tokens: int = 8
    # Each arriving request's sampling parameters (SamplingSpec or None: vLLM's defaults);
    # a resumed request and a streaming update carry them again.
    sampling: st.SearchStrategy[Any] = field(default_factory=request_sampling)
    # hook(machine, index, step, obs, findings) -> findings that fail the example;
    # default: every finding that is neither known nor a loud rejection.
    on_step: Callable[..., list[Finding]] | None = None
    # Called with each machine once its example ends (campaign statistics).
    on_teardown: Callable[[Any], None] | None = None
    # True -> rules stop running the real code (a campaign that ran out of time).
    stopped: Callable[[], bool] = lambda: False
    # hook(machine, index, step) before a step runs (a supervised campaign persists the
    # example so far: simrig.supervision.campaign_worker)
    before_step: Callable[..., None] | None = None
    # A simrig.runners.RunnerPool: examples of one config share a runner, reset
    # and checked clean between them (None: a fresh runner per example).
    runners: Any = None

    def validate(self) -> None:
        check_choice("mode", self.mode, MODES)
        check_strategy("sampling", self.sampling)
        for v in self.violations:
            check_choice("violations", v, VIOLATIONS)


class NewFinding(AssertionError):
    """An example produced findings its settings call failing."""

    def __init__(self, findings: list[Finding], steps: list[Step], violations: dict[int, str],
                 config: RunnerConfig):
        self.findings, self.steps, self.violations, self.config = findings, steps, violations, config
        super().__init__("; ".join(f.one_line() for f in findings[:3]))


def default_failing(machine: Any, index: int, step: Step, obs: StepObs,
                    findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if not f.known and not is_loud_rejection(f)]


class SchedulerContractMachine(RuleBasedStateMachine):
    """Unbound, it runs ``MachineSettings()`` (valid mode, small configs)."""

    machine_settings = MachineSettings()

    @classmethod
    def bind(cls, machine_settings: MachineSettings) -> type[SchedulerContractMachine]:
        machine_settings.validate()
        name = f"{cls.__name__}_{machine_settings.mode}"
        return type(name, (cls,), {"machine_settings": machine_settings})

    def __init__(self) -> None:
        super().__init__()
        self.model: SchedulerModel | None = None
        self.harness: Any = None
        self.checker: Any = None
        self.steps: list[Step] = []  # every Step sent, in order
        self.violations: dict[int, str] = {}  # step index -> violation tag
        self.findings: list[Finding] = []
        self._ghosts = 0
        # Ids the runner was told finished (and not re-added since): what a
        # finished_id violation may schedule. Derived from the steps actually
        # sent, not from the model, whose finishes are only pending until the
        # next planned step carries them.
        self._released: list[str] = []

    # ------------------------------------------------------------ set-up
    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        self.model = SchedulerModel(data.draw(self.machine_settings.configs, label="config"))

    def _real_code(self) -> None:
        """The runner and its checker, built when the example sends its first
        step: an example that never sends one (Hypothesis runs many while it
        generates and shrinks) costs no runner."""
        from simrig.checks.checker import Checker
        from simrig.harness import Harness

        ms, config = self.machine_settings, self.config
        self.harness = (ms.runners.acquire(config, ms.stages) if ms.runners is not None
                        else Harness(config, stages=ms.stages))
        self.checker = Checker(config, adversarial=ms.mode == "adversarial", trace="hypothesis")

    @property
    def config(self) -> RunnerConfig:
        return self.model.config

    # ------------------------------------------------------------ scheduler events
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        cfg = self.config
        if len(self.model.waiting()) >= 2 * cfg.max_num_reqs:
            return
        prompt_len = data.draw(prompt_lengths(max_model_len=cfg.max_model_len), label="prompt_len")
        hit = data.draw(prefix_cache_hits(prompt_len, block_size=tokens_per_block(cfg)), label="prefix_hit")
        if cfg.num_speculative_tokens and prompt_len > 1 and data.draw(st.integers(0, 3), label="pd") == 0:
            hit = prompt_len - 1  # P/D: every prompt token's KV but the last loaded remotely
        max_tokens = data.draw(st.integers(1, self.machine_settings.max_new_tokens), label="max_tokens")
        lora_id = data.draw(lora_ids(cfg.max_loras), label="lora_id") if cfg.max_loras else None
        spec = data.draw(self.machine_settings.sampling, label="sampling")
        grammar = data.draw(grammar_sizes(cfg), label="grammar")  # a structured-output request's set size
        self.model.arrive(prompt_len, max_tokens, hit, lora_id, within_max_tokens(spec, max_tokens), grammar)

    @precondition(lambda self: self.model is not None and self.model.held())
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.model.abort(data.draw(st.sampled_from([r.req_id for r in self.model.held()])))

    @precondition(lambda self: self.model is not None and self.model.preemptable())
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        self.model.preempt(data.draw(st.sampled_from([r.req_id for r in self.model.preemptable()])))

    @precondition(lambda self: self.model is not None and self.model.preempted())
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.model.preempted()))
        hit = prefix_cache_hits(req.num_tokens, block_size=tokens_per_block(self.config))
        self.model.resume(req.req_id, data.draw(hit))

    @precondition(lambda self: self.model is not None and self.model.streamable())
    @rule(data=st.data())
    def stream_input(self, data: st.DataObject) -> None:
        """A streaming-input update: the request's next input, sent as new with its live
        id once its turn stopped (valid in every mode)."""
        draw_stream_input(data.draw, self.model, self.machine_settings.max_new_tokens)

    @rule(data=st.data())
    def schedule(self, data: st.DataObject) -> None:
        if not self.model.waiting() and not self.model.schedulable_running():
            self.arrive(data)  # keep the scheduler busy: most rules should send a step
        plan = draw_plan(data.draw, self.model)
        if plan is None and self.model.cooling():
            plan = Plan([])  # PP: every running request waits for its interval; the ring advances
        if plan is not None:
            self._send(self.model.build_step(plan), None)

    @rule(data=st.data())
    def large_then_small(self, data: st.DataObject) -> None:
        """A large batch, then a small one on the same runner: the small batch's padded
        rows and tokens, and the dummy runs after it, meet shared buffers (block tables,
        slot mappings, seq_lens, query_start_loc, positions) a larger batch filled further;
        the idle dummy between the two is drawn (present or not).
        A rule of its own, so a campaign draws this order as often as any other rule."""
        for _ in range(data.draw(st.integers(1, self.config.max_num_reqs), label="arrivals")):
            self.arrive(data)
        large = draw_large_plan(data.draw, self.model)
        if large is None:
            return
        step = self.model.build_step(large)
        # with no idle dummy between them (a rank that is never idle), the small batch's
        # gather meets the shared block tables exactly as the large one left them
        step.idle_dummy = data.draw(st.booleans(), label="idle_dummy_between")
        self._send(step, None)
        small = draw_small_plan(data.draw, self.model)
        if small is not None:
            self._send(self.model.build_step(small), None)

    @precondition(lambda self: self.model is not None
                  and bool(self.model.pending_finished or self.model.pending_preempted))
    @rule()
    def report_only(self) -> None:
        """A step that schedules nothing and only reports finished and preempted
        requests (execute_model's no-forward branch)."""
        self._send(self.model.build_step(Plan([])), None)

    # ------------------------------------------------------------ violations
    @precondition(lambda self: self.machine_settings.mode == "adversarial"
                  and self.model is not None and self.machine_settings.violations)
    @rule(data=st.data())
    def violate(self, data: st.DataObject) -> None:
        """One contract violation, as a step of its own (one rule, so violations
        stay a minority of the steps)."""
        possible = [v for v in self.machine_settings.violations
                    if v in (UNKNOWN_ID, UNKNOWN_CACHED)
                    or (v == FINISHED_ID and self._released)
                    or (v == DUPLICATE_NEW and self.model.schedulable_running())]
        if not possible:
            return
        violation = data.draw(st.sampled_from(possible), label="violation")
        if violation == UNKNOWN_ID:
            step = Step(num_scheduled_tokens={self._ghost(): 1})
        elif violation == UNKNOWN_CACHED:
            ghost = self._ghost()
            step = Step(cached=[CachedUpdate(ghost, 0)], num_scheduled_tokens={ghost: 1})
        elif violation == FINISHED_ID:
            step = Step(num_scheduled_tokens={data.draw(st.sampled_from(self._released)): 1})
        else:
            req = data.draw(st.sampled_from(self.model.schedulable_running()))
            self.model.resend_as_new(req.req_id)
            limit, _ = self.model.max_rows(req, self.config.max_num_batched_tokens)
            step = self.model.build_step(Plan([Row(req.req_id, limit)]))
        self._send(step, violation)

    def _ghost(self) -> str:
        self._ghosts += 1
        return f"ghost{self._ghosts}"

    # ------------------------------------------------------------ the real code
    def _send(self, step: Step, violation: str | None) -> None:
        ms = self.machine_settings
        if ms.stopped():
            return
        if self.harness is not None and getattr(self.harness, "raised_at", None) is not None:
            return  # vLLM raised in this runner: the example ends there (never stepped on)
        index = len(self.steps)
        self.steps.append(step)
        added = {r.req_id for r in step.new_requests}
        self._released = [r for r in self._released if r not in added]
        self._released += [r for r in step.finished if r not in self._released and r not in added]
        if violation is not None:
            self.violations[index] = violation
        from simrig.harness import run_step_guarded

        if self.harness is None:
            self._real_code()
        if ms.before_step is not None:
            ms.before_step(self, index, step)
        obs, rig_errors = run_step_guarded(self.harness, step, "hypothesis")
        found = rig_errors or check_step(self.checker, ms.extra_checks, index, step, obs, violation,
                                         "hypothesis")
        self.findings.extend(found)
        hook = ms.on_step or default_failing
        failing = hook(self, index, step, obs, found)
        if failing:
            raise NewFinding(failing, list(self.steps), dict(self.violations), self.config)

    def teardown(self) -> None:
        ms = self.machine_settings
        if ms.on_teardown is not None and self.model is not None:
            ms.on_teardown(self)
        if ms.runners is not None and self.harness is not None:
            ms.runners.release(self.harness)
            self.harness = None

