"""The state of the step in flight, shared by the harness, its probes and its dummy runs.

``simrig.harness.Harness`` owns one ``StepContext``; ``simrig.stage_probes.Probes`` records
into it from inside vLLM's calls and ``simrig.dummy_paths.DummyRuns`` switches its mode
while vLLM's dummy paths run. See docs/layout.md, 'The step path'.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from simrig import lifeline
from simrig import observe as obs
from simrig.step import Step

# What the runner is doing, as the probes see it:
#   step      a real execute_model: the probes record
#   profile   profile_run; capture: capture_model; dummy: _dummy_run after a step
#   ubatch    the micro-batch split re-run after a step
# In every mode but "step" the probes pass vLLM's calls through unrecorded.
MODES = ("step", "profile", "capture", "dummy", "ubatch")


@dataclasses.dataclass
class StepContext:
    """One runner's step in flight: what it is, what it has observed, which mode it runs."""

    step: Step | None = None
    result: obs.StepObs | None = None
    # the global batch (prepare_inputs' result, or under PCP rank 0's partition input)
    global_batch: Any = None
    # the BatchExecutionDescriptor CudaGraphManager.dispatch returned
    desc: Any = None
    mode: str = "step"
    # the record a dummy path's batch and descriptor are observed on (None: not observed)
    dummy_record: obs.StageObs | None = None
    # the probes' own bookkeeping inside vLLM's calls (not vLLM's time: StepObs.vllm_s)
    probe_rig_s: float = 0.0

    def begin(self, step: Step | None, result: obs.StepObs | None) -> None:
        """A new step: nothing observed yet, the probes recording."""
        self.step, self.result, self.global_batch, self.desc = step, result, None, None
        self.mode, self.dummy_record, self.probe_rig_s = "step", None, 0.0

    def open(self, stage: str, rank: int | None = None) -> obs.StageObs:
        """A new stage record on the step's observation."""
        lifeline.mark_stage(stage)  # a supervised worker's last stage, if it dies in it
        record = obs.StageObs(stage=stage, rank=rank)
        self.result.stages.append(record)
        return record

    @contextlib.contextmanager
    def passing_through(self, mode: str, record: obs.StageObs | None = None) -> Iterator[None]:
        """Run vLLM's calls with the probes passing through (``mode``), observing
        only what lands on ``record``; the previous mode comes back after."""
        if mode not in MODES or mode == "step":
            raise ValueError(f"mode: {mode!r} is not a pass-through mode of {MODES[1:]}")
        before = self.mode, self.dummy_record
        self.mode, self.dummy_record = mode, record
        try:
            yield
        finally:
            self.mode, self.dummy_record = before
