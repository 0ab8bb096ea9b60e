"""All replay checks behind one object.

``Checker.check(index, step, observation)`` returns one step's findings. Stateful: it follows
the lifecycle, the reference model and the dtypes seen across one trace's steps. Findings
matching the installed vLLM's known findings are marked ``known=True``. Each check, its
module and what it judges: the table at the top of docs/oracle.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from simrig.checks.fields import check_model_fields, check_runner_state, runs_as_decode
from simrig.checks.readded import check_added_state
from simrig.checks.lifecycle import (
    DUPLICATE_NEW,
    IDENTITY_RULES,
    LOUD_KINDS,
    UNKNOWN_CACHED,
    SchedulerContract,
)
from simrig.checks.parity import check_parity, desc_key
from simrig.checks.pp_ranks import PipelineTracker
from simrig.checks.spec_outcomes import check_spec_outcomes
from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.findings.known import KnownFindings, installed_vllm_version, load_known_findings
from simrig.graph_rules.dummy_batches import (
    check_capture_dcp_context,
    check_capture_padding,
    check_dummy_dcp,
    check_dummy_moe_rows,
    check_idle_dummy,
    check_placeholder_fields,
    check_profile,
)
from simrig.graph_rules.lora_dispatch import AdapterTracker, check_lora_captures, check_lora_dispatch
from simrig.graph_rules.lora_inputs import check_lora_inputs
from simrig.graph_rules.padded_attn import check_dummy_attn, check_dummy_shape, check_padded_shapes
from simrig.graph_rules.padding import check_capture, check_capture_sizes, check_dispatch
from simrig.graph_rules.padding import descriptor, sizes_in_force
from simrig.graph_rules.ubatch_split import check_ubatches
from simrig.observe import CAPTURE, CAPTURE_SIZES, DUMMY, GATHER, LIFECYCLE, PARTITION, PREPARE, PROFILE
from simrig.observe import StepObs
from simrig.sampling_checks.oracle import SamplingOracle
from simrig.partition.pcp import check_dcp_peers, check_pcp
from simrig.reference.blocks import BlockTracker, check_attn_blocks
from simrig.reference.contract import DriftTracker, check_contract
from simrig.reference.reference import GlobalBatch, ReferenceModel
from simrig.reference.semantics import check_batch_semantics
from simrig.step import RunnerConfig, Step

# An extra check a campaign or a test adds: (index, step, observation) -> findings.
ExtraCheck = Callable[[int, Step, StepObs], list[Finding]]


class Checker:
    def __init__(self, config: RunnerConfig, *, adversarial: bool = False, trace: str = "",
                 known: KnownFindings | None = None):
        self.config = config
        self.adversarial = adversarial
        self.trace = trace
        self.known = known if known is not None else load_known_findings(installed_vllm_version())
        self.lifecycle = SchedulerContract(config, adversarial=adversarial)
        self.reference = ReferenceModel(config)
        self.sampling = SamplingOracle(config)  # what vLLM's sampler made of each request's parameters
        self.blocks = BlockTracker(config.num_kv_groups)
        self.adapters = AdapterTracker()  # each live request's LoRA adapter
        self.pipeline = PipelineTracker(config)  # the non-last PP rank (pp_size > 1)
        # the capture dummy of every captured descriptor (observed before step 0)
        self.captured: dict[tuple, Any] = {}
        self.drift = DriftTracker()
        self.identity_ids: set[str] = set()  # ids the last step's identity violations name
        # requests a runner exception on valid input left with undefined runner state
        # (execute_model stopped mid-step: vLLM would have stopped serving); their values
        # are not judged until they are finished, preempted or sent again as new
        self.broken: set[str] = set()
        # the capture sizes the runner used, as last recorded (judged once per change)
        self.sizes_seen: tuple[int, ...] | None = None
        # the run configuration a known finding's ``when`` conditions read
        self.context = {"pcp_size": config.pcp_size, "dcp_size": config.dcp_size,
                        "num_speculative_tokens": config.num_speculative_tokens,
                        "shard_decode_requests": int(bool(config.shard_decode_requests)),
                        "pp_size": config.pp_size}

    def check(self, index: int, step: Step, observation: StepObs) -> list[Finding]:
        """Every check on one step; one that raises is a ``rig_error`` finding, the rest still run."""
        findings: list[Finding] = []
        life = None
        with self._rig_errors(findings, index, "scheduler_contract"):
            life = self.lifecycle.check(index, step, observation)
        if life is not None:
            findings.extend(life.findings)
            findings.extend(check_runner_state(index, self.config, observation, self.lifecycle.live))
            findings.extend(check_added_state(index, self.config, step, observation,
                                              frozenset(r for v in life.violations for r in v.req_ids)))
        with self._rig_errors(findings, index, "contract"):
            self._dtype_checks(index, step, observation, findings)
        with self._rig_errors(findings, index, "semantics"):
            self._dummy_semantics(index, observation, findings)
        with self._rig_errors(findings, index, "dispatch"):
            self._capture_sizes(index, observation, findings)
        with self._rig_errors(findings, index, "dummy_batches"):
            self._dummy_batches(index, step, observation, findings)
        with self._rig_errors(findings, index, "reference"):
            self.reference.apply_lifecycle(step)
        with self._rig_errors(findings, index, "blocks"):
            self.blocks.apply(step)
        with self._rig_errors(findings, index, "lora_dispatch"):
            self.adapters.apply(step)
        # A crashed lifecycle check leaves the contract state unknown: no
        # semantic check has a defined expectation. Otherwise the requests a
        # violation names (and those whose cursor it desynced) are set aside:
        # every other request's values are still checked.
        for req_id in (*step.finished, *step.preempted, *(r.req_id for r in step.new_requests)):
            self.broken.discard(req_id)
        touched = self.touched_by(life, step)
        if touched is not None:
            touched |= self.broken & set(step.num_scheduled_tokens)
        self.identity_ids = _identity_ids(life)
        if touched is not None:
            semantic: list[Finding] = []
            with self._rig_errors(findings, index, "semantics"):
                semantic = self._semantic_checks(index, step, observation, frozenset(touched))
            if touched:  # a finding about a set-aside request, or about no request, is undefined
                semantic = [f for f in semantic if f.kind == fk.RIG_ERROR
                            or (f.req_ids and not set(f.req_ids) & touched)]
            findings.extend(semantic)
        piped: list[Finding] = []
        with self._rig_errors(findings, index, "pipeline"):
            piped = self.pipeline.check(index, step, observation)
        undefined = (touched or set()) | self.broken
        findings.extend(f for f in piped if f.kind == fk.CONTRACT_VIOLATION_INPUT
                        or not set(f.req_ids) & undefined)
        with self._rig_errors(findings, index, "sampling"):
            findings.extend(f for f in self.sampling.check(index, step, observation)
                            if not set(f.req_ids) & undefined)
        with self._rig_errors(findings, index, "reference"):
            self.reference.advance(step, observation)
        failed = False  # a malformed observation (a rig bug) leaves nothing set aside
        with self._rig_errors(findings, index, "runner_state"):
            failed = life is not None and not life.violations and observation.step_failed()
        if failed:
            self.broken |= set(step.num_scheduled_tokens)
        for f in findings:
            f.trace = self.trace
        marked = None
        with self._rig_errors(findings, index, "known"):
            marked = self.known.apply(findings, self.context)
        return marked if marked is not None else findings

    def touched_by(self, life: Any, step: Step) -> set[str] | None:
        """The request ids whose expectations this step leaves undefined: those
        a violation names, and scheduled ones whose cursor an earlier
        violation desynced; None when the lifecycle check itself crashed."""
        if life is None:
            return None
        touched = {r for v in life.violations for r in v.req_ids}
        return touched | (self.lifecycle.desynced & set(step.num_scheduled_tokens))

    @contextlib.contextmanager
    def _rig_errors(self, findings: list[Finding], index: int, check: str) -> Iterator[None]:
        """The block's exception, if any, becomes one rig_error finding of ``check``
        and the step's other checks still run (a check's bug is a finding)."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 -- a check's bug is a finding
            findings.append(fk.rig_error(exc, step=index, check=check, trace=self.trace))

    def _dtype_checks(self, index: int, step: Step, observation: StepObs,
                      findings: list[Finding]) -> None:
        # gather's BatchReqState has no draft count of its own; the Step has.
        has_drafts = any(n > 0 for n in step.spec_tokens.values())
        for stage in observation.stages:
            found = check_contract(index, stage, has_drafts if stage.stage == GATHER else None)
            findings.extend(_label_capture(found, stage) if stage.stage == CAPTURE else found)
            findings.extend(self.drift.check(index, stage))

    def _dummy_semantics(self, index: int, observation: StepObs, findings: list[Finding]) -> None:
        for capture in observation.all(CAPTURE):
            if capture.error is None:
                self.captured[desc_key(capture.fields, "desc.")] = capture
        dummy = observation.get(DUMMY)
        if dummy is not None:  # built from (num_reqs, num_tokens) alone: always defined
            findings.extend(check_batch_semantics(index, dummy))
        for capture in observation.all(CAPTURE):
            found = check_batch_semantics(index, capture) + check_capture(index, self.config, capture)
            findings.extend(_label_capture(found, capture))
        findings.extend(check_lora_captures(index, self.config, observation.all(CAPTURE)))

    def _dummy_batches(self, index: int, step: Step, observation: StepObs,
                       findings: list[Finding]) -> None:
        """Each dummy batch held to what it is for (dummy_batches.py), and every batch's
        fields of features never enabled. Built from sizes alone: always defined."""
        config = self.driven(observation)
        for stage in observation.stages:
            findings.extend(check_placeholder_fields(index, stage, pp=config.pp_size > 1))
        for profile in observation.all(PROFILE):
            findings.extend(check_batch_semantics(index, profile) + check_profile(index, config, profile))
            findings.extend(check_dummy_moe_rows(index, config, profile))
        dummy = observation.get(DUMMY)
        if dummy is not None:
            findings.extend(check_idle_dummy(index, step.total_num_scheduled_tokens, dummy))
            findings.extend(check_dummy_dcp(index, config, dummy) + check_dummy_moe_rows(index, config, dummy))
            findings.extend(check_dummy_attn(index, config, dummy) + check_dummy_shape(index, dummy))
        for capture in observation.all(CAPTURE):
            found = check_capture_padding(index, capture) + check_dummy_dcp(index, config, capture)
            found += check_dummy_moe_rows(index, config, capture) + check_capture_dcp_context(index, config, capture)
            found += check_dummy_attn(index, config, capture) + check_dummy_shape(index, capture)
            findings.extend(_label_capture(found, capture))

    def _capture_sizes(self, index: int, observation: StepObs, findings: list[Finding]) -> None:
        desc = descriptor(observation)
        sizes = None if desc is None else desc.get(CAPTURE_SIZES)
        if sizes is not None and tuple(sizes) != self.sizes_seen:
            self.sizes_seen = tuple(sizes)
            findings.extend(check_capture_sizes(index, self.config, sizes))

    def driven(self, obs: StepObs) -> RunnerConfig:
        """The configuration the runner actually ran: without PCP where the harness
        could not drive the trace's PCP configuration on this release (lifecycle's
        ``runner.pcp_size`` is 1; the replay lists it as unavailable)."""
        life = obs.get("lifecycle")
        size = life.fields.get("runner.pcp_size") if life is not None else None
        if self.config.pcp_size > 1 and size is not None and size.values == 1:
            return dataclasses.replace(self.config, pcp_size=1, dcp_size=1, shard_decode_requests=False)
        return self.config

    def _semantic_checks(self, index: int, step: Step, obs: StepObs,
                         skip: frozenset[str] = frozenset()) -> list[Finding]:
        config = self.driven(obs)
        out = self.reference.compare(index, step, obs, skip)
        real, dummy = obs.get(PREPARE), obs.get(DUMMY)
        desc = descriptor(obs)
        out.extend(check_lora_dispatch(index, config, desc, self.adapters.num_active(step.req_ids),
                                       tuple(step.req_ids)))
        partitions = obs.all(PARTITION)
        # the LoRA mapping, on the batch the forward runs (PCP rank 0's share under PCP)
        forward = obs.get(PARTITION, 0) if config.pcp_size > 1 and partitions else real
        out.extend(check_lora_inputs(index, step, forward, self.adapters.adapter,
                                     forward is not real, skip))
        if real is not None:
            out.extend(check_batch_semantics(index, real))
        if real is not None and dummy is not None:
            captured = self.captured.get(desc_key(desc, "")) if desc else None
            # under PCP the dummy is staged for a rank (prepare_inputs_for_capture_or_profile):
            # it is compared with the rank-local batch the forward runs
            runs = obs.get(PARTITION, 0) if config.pcp_size > 1 and partitions else real
            out.extend(check_parity(index, runs or real, dummy, desc, partitions or None, captured))
        for part in partitions:  # rank-local batches keep the same field meanings
            out.extend(check_batch_semantics(index, part))
        # the reference's global batch, built once: the PCP and the block checks both read it
        order = self.reference.observed_order(obs)
        batch = self.reference.global_batch(step, order)
        if real is not None and partitions and self.config.pcp_size > 1:
            out.extend(check_pcp(index, self.config, real, partitions, batch, desc))
        out.extend(check_dcp_peers(index, obs))
        out.extend(self._block_checks(index, obs, config, order, batch))
        pred = self.reference.predict(step, order)
        out.extend(check_model_fields(index, config, step, obs, pred, skip))
        out.extend(check_spec_outcomes(index, config, step, obs, pred, skip))
        if pred is not None:
            # rows that run as decodes: decodes, and (without PCP, which partitions
            # prefill rows) prefills of one new token over context (fields.runs_as_decode)
            # (a release whose BatchReqState has no decode_graph_eligible, 0.30.0, runs no
            # prefill row as a decode)
            gather = obs.get(GATHER)
            knows = gather is None or gather.declared is None or "decode_graph_eligible" in gather.declared
            as_decode = ~pred.is_prefilling
            if config.pcp_size == 1 and knows:
                as_decode = as_decode | runs_as_decode(pred.is_prefilling, pred.num_scheduled,
                                                       pred.num_drafts, pred.num_computed)
            out.extend(check_dispatch(index, sizes_in_force(config, desc), desc, pred.num_scheduled,
                                      pred.is_prefilling, as_decode, tuple(pred.req_ids)))
            out.extend(check_ubatches(index, config, obs, pred.num_scheduled, pred.is_prefilling,
                                      as_decode, tuple(pred.req_ids)))
        return out


    def _block_checks(self, index: int, obs: StepObs, config: RunnerConfig, order: list[str] | None,
                      batch: GlobalBatch | None) -> list[Finding]:
        """prepare_attn's block tables and slot mappings, on the batch the runner
        ran: the global one, or PCP rank 0's rank-local one (``batch``: the
        reference's global batch in the observed ``order``)."""
        if not order:
            return []
        if config.pcp_size > 1:
            local = obs.get(PARTITION, 0)
            if local is None or local.error is not None or "req_ids" not in local.fields:
                return []
            return check_attn_blocks(config, self.blocks, index, local, batch,
                                     list(local.fields["req_ids"].values)) \
                + check_padded_shapes(index, config, local)
        real = obs.get(PREPARE)
        if real is None or real.error is not None:
            return []
        return check_attn_blocks(config, self.blocks, index, real, batch) \
            + check_padded_shapes(index, config, real)


def _label_capture(found: list[Finding], capture: Any) -> list[Finding]:
    """Name the descriptor a capture dummy was built for in each of its findings."""
    desc = {k[len("desc."):]: f.values for k, f in capture.fields.items() if k.startswith("desc.")}
    label = f" [capture dummy for {desc.get('cg_mode')} {desc.get('num_tokens')} tokens]"
    for f in found:
        if f.kind != fk.RIG_ERROR:
            f.message += label
    return found


def check_step(checker: Checker, extra_checks: Sequence[ExtraCheck], index: int, step: Step,
               obs: StepObs, violation: str | None, trace: str = "") -> list[Finding]:
    """All findings of one step, the same in replay, campaigns, shrinking and the self-test.

    The Checker, the extra checks, then two fallbacks: every runner exception
    no check reported, and, on a step that carries a violation, a
    ``silent_acceptance`` when nothing raised. Loud rejections of a violation
    step are marked ``extra["loud_rejection"]`` (the expected answer).
    """
    found = list(checker.check(index, step, obs))
    for check in extra_checks:
        try:
            found.extend(check(index, step, obs))
        except Exception as exc:  # noqa: BLE001 -- an extra check's bug is a finding
            name = getattr(check, "__name__", type(check).__name__)
            found.append(fk.rig_error(exc, step=index, check=f"extra:{name}", trace=trace))
    found += checker.known.apply(runner_error_findings(index, step, obs, found, trace), checker.context)
    if violation is not None:
        found += silent_acceptance_finding(index, step, obs, violation, found, trace)
    if violation is not None or checker.adversarial:
        for f in found:
            if is_rejection_of(f, checker.identity_ids):
                f.extra["loud_rejection"] = True
                f.extra["violation"] = violation or f.field
    for f in found:
        f.trace = f.trace or trace
    return found


def is_rejection_of(finding: Finding, bad_ids: set[str]) -> bool:
    """Whether ``finding`` is the loud answer to an identity violation naming
    ``bad_ids``: a KeyError (or the checker's note on the input) in lifecycle
    or gather, the stages that must refuse it, naming one of those ids. Any
    other finding of the step (another stage, another request) stays a finding."""
    return (finding.kind in LOUD_KINDS and finding.stage in (LIFECYCLE, GATHER)
            and bool(set(finding.req_ids) & bad_ids))


def _identity_ids(life: Any) -> set[str]:
    if life is None:
        return set()
    return {r for v in life.violations if v.rule in IDENTITY_RULES for r in v.req_ids}


def is_loud_rejection(finding: Finding) -> bool:
    return bool(finding.extra.get("loud_rejection"))


@fk.guarded("runner")
def runner_error_findings(index: int, step: Step, obs: StepObs, reported: list[Finding],
                          trace: str = "") -> list[Finding]:
    """A finding for every exception no check reported (kind key_error or exception, actual as
    runner_errors states it, judged as known by check_step), so no runner failure is ever dropped."""
    covered = {(f.stage, f.rank, f.exception_type) for f in reported}
    out = []
    for stage in obs.errors:
        err = stage.error
        if (stage.stage, stage.rank, err.type) in covered:
            continue
        out.append(Finding(kind=fk.KEY_ERROR if err.type == "KeyError" else fk.EXCEPTION,
                           step=index, stage=stage.stage, check="runner", rank=stage.rank,
                           req_ids=tuple(err.req_ids), actual=f"{err.type}: {err.message}",
                           message=err.message, exception_type=err.type, trace=trace))
    return out


@fk.guarded("machine")
def silent_acceptance_finding(index: int, step: Step, obs: StepObs, violation: str,
                              reported: list[Finding], trace: str = "") -> list[Finding]:
    """A violation neither lifecycle nor gather (the stages that must refuse
    it) raised on, unless the checks already said so; an error in a later
    stage is no rejection."""
    if any(e.stage in (LIFECYCLE, GATHER) for e in obs.errors) or any(f.kind == fk.SILENT_ACCEPTANCE for f in reported):
        return []
    stage = "lifecycle" if violation in (UNKNOWN_CACHED, DUPLICATE_NEW) else "gather"
    return [Finding(kind=fk.SILENT_ACCEPTANCE, step=index, stage=stage, check="machine",
                    req_ids=tuple(step.num_scheduled_tokens), field=violation,
                    message=f"{violation}: runner accepted the step without failing", trace=trace)]
