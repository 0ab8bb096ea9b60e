"""All replay checks behind one object (implementation in progress).

``Checker.check(index, step, observation)`` returns the findings of one step.
A Checker is stateful: it follows the request lifecycle, the reference model
and the dtypes seen so far across the steps of one trace.
"""

from __future__ import annotations

from simrig.findings import Finding
from simrig.observe import StepObs
from simrig.step import RunnerConfig, Step


class Checker:
    def __init__(self, config: RunnerConfig, *, adversarial: bool = False, trace: str = ""):
        self.config = config
        self.adversarial = adversarial
        self.trace = trace

    def check(self, index: int, step: Step, observation: StepObs) -> list[Finding]:
        return []
