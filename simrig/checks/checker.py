"""All replay checks behind one object.

``Checker.check(index, step, observation)`` returns the findings of one step.
A Checker is stateful: it follows the request lifecycle, the reference model
and the dtypes seen so far across the steps of one trace.

    per step                         check name           module
    ────────                         ──────────           ──────
    scheduler contract, loudness     scheduler_contract   lifecycle_checks
    exceptions on valid input        runner_errors        lifecycle_checks
    declared dtypes, every stage     contract             contract
    dtype stable across steps        drift                contract
    ── skipped when the input breaks the contract (expectations undefined) ──
    dummy == real batch              parity               parity
    independent reference model      reference            reference
    PCP partition invariants         pcp                  pcp_checks

Findings matching the committed known findings of the installed vLLM are
marked ``known=True``.
"""

from __future__ import annotations

from simrig.checks.contract import DriftTracker, check_contract
from simrig.checks.findings import Finding
from simrig.checks.known import KnownFindings, installed_vllm_version, load_known_findings
from simrig.checks.lifecycle import SchedulerContract
from simrig.observe import DUMMY, PARTITION, PREPARE, StepObs
from simrig.checks.parity import check_parity
from simrig.checks.pcp import check_pcp
from simrig.checks.reference import ReferenceModel
from simrig.step import RunnerConfig, Step


class Checker:
    def __init__(self, config: RunnerConfig, *, adversarial: bool = False, trace: str = "",
                 known: KnownFindings | None = None):
        self.config = config
        self.adversarial = adversarial
        self.trace = trace
        self.known = known if known is not None else load_known_findings(installed_vllm_version())
        self.lifecycle = SchedulerContract(config, adversarial=adversarial)
        self.reference = ReferenceModel(config)
        self.drift = DriftTracker()

    def check(self, index: int, step: Step, observation: StepObs) -> list[Finding]:
        life = self.lifecycle.check(index, step, observation)
        findings = list(life.findings)
        for stage in observation.stages:
            findings.extend(check_contract(index, stage))
            findings.extend(self.drift.check(index, stage))
        self.reference.apply_lifecycle(step)
        desynced = self.lifecycle.desynced & set(step.num_scheduled_tokens)
        if not life.violated and not desynced:
            findings.extend(self._semantic_checks(index, step, observation))
        self.reference.advance(step)
        for f in findings:
            f.trace = self.trace
        return self.known.apply(findings)

    def _semantic_checks(self, index: int, step: Step, obs: StepObs) -> list[Finding]:
        out = self.reference.compare(index, step, obs)
        real, dummy = obs.get(PREPARE), obs.get(DUMMY)
        if real is not None and dummy is not None:
            out.extend(check_parity(index, real, dummy))
        partitions = [s for s in obs.stages if s.stage == PARTITION]
        if real is not None and partitions and self.config.pcp_size > 1:
            out.extend(check_pcp(index, self.config, real, partitions))
        return out
