"""The scheduler contract, and how the runner reacts to input that breaks it.

``SchedulerContract`` follows request identity and budgets from the Steps alone (its
docstring has the rules). An identity violation must make the runner fail loudly, a budget
violation is reported as an input violation only, and an exception on valid input is a
finding of ``runner_errors``. See docs/oracle.md, 'The oracle: what every replay checks'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import GATHER, LIFECYCLE, StepObs
from simrig.step import NewRequest, RunnerConfig, Step

# The violation a contract-breaking step carries (a shrunk trace's header
# names them per step in ``source.violation_steps``); each must make the
# runner raise.
UNKNOWN_ID = "unknown_id"  # scheduled id never sent
FINISHED_ID = "finished_id"  # scheduled id already finished
UNKNOWN_CACHED = "unknown_cached"  # cached update for an id never sent
DUPLICATE_NEW = "duplicate_new"  # new request for an id the runner still holds
VIOLATIONS = (UNKNOWN_ID, FINISHED_ID, UNKNOWN_CACHED, DUPLICATE_NEW)
# Finding kinds that mean "the runner (or the contract check) refused the input".
LOUD_KINDS = (fk.KEY_ERROR, fk.CONTRACT_VIOLATION_INPUT)

# Violations the runner must answer with an exception (identity rules).
IDENTITY_RULES = ("unknown_scheduled_id", "scheduled_after_finish", "duplicate_new_id",
                  "unknown_cached_id")


@dataclass
class Violation:
    rule: str
    req_ids: tuple[str, ...]
    expected: str
    actual: str


@dataclass
class LifecycleResult:
    findings: list[Finding] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def violated(self) -> bool:
        return bool(self.violations)


class SchedulerContract:
    """Follows request identity and budgets from the Steps alone:

        finished / preempted  ──► gone (the runner frees the slot; scheduling it again is a violation)
        new_requests          ──► live (a live id sent as new again is a duplicate, unless it is a
                                  streaming-input update: ``streaming``, an id the runner holds, computed
                                  tokens no further than the runner's own count)
        cached updates        ──► must name a live id; num_computed must continue the last step
                                  (previous + scheduled - rejected), else the runner's device
                                  cursor and the scheduler disagree
        num_scheduled_tokens  ──► every id live after this step's lifecycle, and updated this step

    Identity violations must make the runner fail loudly (KeyError in lifecycle
    or gather): KeyError -> key_error finding naming the id, another exception ->
    exception finding, nothing raised -> silent_acceptance. Budget violations are
    reported as input violations only. Exceptions on valid input are findings
    (key_error / exception) of check "runner_errors".
    """
    def __init__(self, config: RunnerConfig, *, adversarial: bool = False):
        self.config = config
        self.adversarial = adversarial
        self.live: set[str] = set()
        self.gone: set[str] = set()  # finished or preempted, not re-added
        # req_id -> num_computed the next cached update must carry
        self.next_computed: dict[str, int] = {}
        self.desynced: set[str] = set()  # runner cursor no longer matches the scheduler
        self.prefill_len: dict[str, int] = {}  # req_id -> tokens handed to the runner

    # ------------------------------------------------------------ the rules
    def violations(self, step: Step) -> list[Violation]:
        out: list[Violation] = []
        for req_id in (*step.finished, *step.preempted):
            self.live.discard(req_id)
            self.gone.add(req_id)
            self.next_computed.pop(req_id, None)
            self.desynced.discard(req_id)
        seen: set[str] = set()
        for req in step.new_requests:
            if req.req_id in seen or (req.req_id in self.live and not req.streaming):
                out.append(Violation("duplicate_new_id", (req.req_id,), "an id not held by the runner",
                                     f"{req.req_id} is already live"))
            elif req.streaming:
                out.extend(self._streaming(req))
            seen.add(req.req_id)
        for req in step.new_requests:
            self.live.add(req.req_id)
            self.gone.discard(req.req_id)
            self.next_computed[req.req_id] = req.num_computed_tokens
            self.desynced.discard(req.req_id)
        cached_ids = set()
        computed: dict[str, int] = {r.req_id: r.num_computed_tokens for r in step.new_requests}
        for upd in step.cached:
            cached_ids.add(upd.req_id)
            if upd.req_id not in self.live:
                rule = "scheduled_after_finish" if upd.req_id in self.gone else "unknown_cached_id"
                out.append(Violation(rule, (upd.req_id,), "a live request id",
                                     f"cached update for {upd.req_id}"))
                continue
            want = self.next_computed.get(upd.req_id)
            if want is not None and upd.num_computed_tokens != want:
                out.append(Violation("num_computed_tokens", (upd.req_id,), str(want),
                                     str(upd.num_computed_tokens)))
                self.desynced.add(upd.req_id)
            computed[upd.req_id] = upd.num_computed_tokens
        new_ids = {r.req_id for r in step.new_requests}
        for req_id in step.num_scheduled_tokens:
            if req_id not in self.live:
                rule = "scheduled_after_finish" if req_id in self.gone else "unknown_scheduled_id"
                out.append(Violation(rule, (req_id,), "a live request id", f"{req_id} scheduled"))
            elif req_id not in cached_ids and req_id not in new_ids:
                out.append(Violation("scheduled_without_update", (req_id,),
                                     "a new request or a cached update", "neither"))
        out.extend(self._budget(step, computed))
        self._advance(step)
        return out

    def _streaming(self, req: NewRequest) -> list[Violation]:
        """A streaming-input update re-sends a request the runner holds: vLLM's scheduler
        keeps a paused session's slot ("Paused streaming sessions ... still hold a
        model-runner request slot") and resumes it from its computed frontier, never
        past what the runner computed (``_handle_stopped_request``: "resume from the
        materialized frontier"; a stop may trim accepted tokens, so it can be less)."""
        if req.req_id not in self.live:
            return [Violation("streaming_update", (req.req_id,), "an id the runner holds",
                              f"streaming update of {req.req_id}, which is not live")]
        have = self.next_computed.get(req.req_id)
        if have is not None and req.req_id not in self.desynced and req.num_computed_tokens > have:
            return [Violation("streaming_update", (req.req_id,), f"num_computed_tokens <= {have}",
                              str(req.num_computed_tokens))]
        return []

    def _budget(self, step: Step, computed: dict[str, int]) -> list[Violation]:
        cfg, out = self.config, []
        total = step.total_num_scheduled_tokens
        if total > cfg.max_num_batched_tokens:
            out.append(Violation("max_num_batched_tokens", tuple(step.num_scheduled_tokens),
                                 f"<= {cfg.max_num_batched_tokens}", str(total)))
        if len(step.num_scheduled_tokens) > cfg.max_num_reqs:
            out.append(Violation("max_num_reqs", tuple(step.num_scheduled_tokens),
                                 f"<= {cfg.max_num_reqs} scheduled", str(len(step.num_scheduled_tokens))))
        if len(self.live) > cfg.max_num_reqs:
            out.append(Violation("max_num_reqs", tuple(sorted(self.live)),
                                 f"<= {cfg.max_num_reqs} live", str(len(self.live))))
        prefill = {r.req_id: r.num_prefill_tokens for r in step.new_requests}
        for req_id, q in step.num_scheduled_tokens.items():
            k = step.spec_tokens.get(req_id, 0)
            nc = computed.get(req_id)
            if q < 1:
                out.append(Violation("num_scheduled_tokens", (req_id,), ">= 1", str(q)))
            if k > cfg.num_speculative_tokens or q < 1 + k:
                out.append(Violation("spec_tokens", (req_id,),
                                     f"<= {cfg.num_speculative_tokens} drafts and < {q} scheduled", str(k)))
            if nc is not None and nc + q > cfg.max_model_len:
                out.append(Violation("max_model_len", (req_id,), f"num_computed + scheduled <= {cfg.max_model_len}",
                                     f"{nc} + {q}"))
            plen = prefill.get(req_id, self.prefill_len.get(req_id))
            if nc is not None and plen is not None:
                if nc >= plen and q != 1 + k:
                    out.append(Violation("decode_query_len", (req_id,), f"1 + {k} drafts", str(q)))
                elif nc < plen and nc + q - k > plen:
                    out.append(Violation("prefill_overrun", (req_id,), f"<= prefill_len {plen}",
                                         f"{nc} + {q - k}"))
        for name, ids in (("spec_tokens", step.spec_tokens), ("rejected", step.rejected)):
            for req_id in ids:
                if req_id not in step.num_scheduled_tokens:
                    out.append(Violation(name, (req_id,), "a scheduled request", f"{req_id} not scheduled"))
        for req_id, r in step.rejected.items():
            if r > step.spec_tokens.get(req_id, 0):
                out.append(Violation("rejected", (req_id,), f"<= {step.spec_tokens.get(req_id, 0)} drafts", str(r)))
        return out

    def _advance(self, step: Step) -> None:
        for req in step.new_requests:
            self.prefill_len[req.req_id] = req.num_prefill_tokens
        for upd in step.cached:
            if upd.req_id in self.live:
                self.next_computed[upd.req_id] = upd.num_computed_tokens
        for req_id in step.num_scheduled_tokens:
            if req_id in self.next_computed:
                self.next_computed[req_id] += step.num_accepted(req_id)

    # ------------------------------------------------------------ per step
    def check(self, index: int, step: Step, obs: StepObs) -> LifecycleResult:
        result = LifecycleResult(violations=self.violations(step))
        for v in result.violations:
            result.findings.append(Finding(
                kind=fk.CONTRACT_VIOLATION_INPUT, step=index, stage=LIFECYCLE, check="scheduler_contract",
                req_ids=v.req_ids, field=v.rule, expected=v.expected, actual=v.actual,
                message=f"input breaks the scheduler contract ({v.rule}): {v.actual}",
                extra={"adversarial": self.adversarial}))
        identity = [v for v in result.violations if v.rule in IDENTITY_RULES]
        if identity:
            result.findings.extend(self._loudness(index, identity, obs))
        elif not result.violated:
            result.findings.extend(runner_errors(index, obs))
        return result

    def _loudness(self, index: int, identity: list[Violation], obs: StepObs) -> list[Finding]:
        """Identity violations must raise in lifecycle or gather."""
        bad_ids = tuple(dict.fromkeys(r for v in identity for r in v.req_ids))
        for stage_name in (LIFECYCLE, GATHER):
            stage = obs.get(stage_name)
            if stage is None or stage.error is None:
                continue
            err = stage.error
            named = tuple(r for r in err.req_ids if r in bad_ids) or bad_ids
            kind = fk.KEY_ERROR if err.type == "KeyError" else fk.EXCEPTION
            return [Finding(kind=kind, step=index, stage=stage_name, check="scheduler_contract",
                            req_ids=named, field=identity[0].rule, expected="KeyError",
                            actual=f"{err.type}: {err.message}", exception_type=err.type,
                            message=f"runner rejected contract-violating input with {err.type} "
                                    f"naming {','.join(err.req_ids) or '?'}")]
        return [Finding(kind=fk.SILENT_ACCEPTANCE, step=index, stage=LIFECYCLE, check="scheduler_contract",
                        req_ids=bad_ids, field=identity[0].rule, expected="KeyError",
                        actual="no exception",
                        message=f"runner accepted {identity[0].rule} for {','.join(bad_ids)} without failing")]


@guarded("runner_errors")
def runner_errors(index: int, obs: StepObs) -> list[Finding]:
    """Every exception the runner raised on valid input."""
    out = []
    for stage in obs.errors:
        err = stage.error
        assert err is not None
        out.append(Finding(
            kind=fk.KEY_ERROR if err.type == "KeyError" else fk.EXCEPTION, step=index,
            stage=stage.stage, check="runner_errors", rank=stage.rank, req_ids=err.req_ids,
            expected="no exception on valid input", actual=f"{err.type}: {err.message}",
            exception_type=err.type, message=f"{err.type} on valid input: {err.message[:200]}"))
    return out
