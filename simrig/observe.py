"""Observations: what one stage of the real code produced, as plain data.

An observation copies every output field off the device (dtype, shape,
values) so later checks and reports never hold vLLM objects or buffers that
the next step overwrites.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Stage names, in the order the runner runs them.
LIFECYCLE = "lifecycle"  # finish / add / update through the real runner
GATHER = "gather"  # GPUModelRunner.gather_batch_req_state
DISPATCH = "dispatch"  # vLLM's cudagraph dispatch: the BatchExecutionDescriptor
PREPARE = "prepare"  # GPUModelRunner.prepare_inputs
PARTITION = "partition"  # PCPManager.partition_batch, one per rank
POSTPROCESS = "postprocess"  # GPUModelRunner.postprocess_sampled (sampler stand-in)
DUMMY = "dummy"  # InputBatch.make_dummy for the step's descriptor
CAPTURE = "capture"  # make_dummy at one capture descriptor (first step only)
PROFILE = "profile"  # GPUModelRunner.profile_run's dummy batch (first step only)
PIPELINE = "pipeline"  # the non-last PP rank's step (pp_size > 1; adapters/pp_peer.py)
UBATCH = "ubatch"  # DBO: vLLM's split decision and micro-batches of the forward batch
STAGES = (LIFECYCLE, GATHER, DISPATCH, PREPARE, PARTITION, POSTPROCESS, DUMMY, PROFILE, CAPTURE,
          PIPELINE, UBATCH)
# The dispatch stage's record of the capture sizes in force (graph modes only):
# the manager's compilation_config.cudagraph_capture_sizes, as vLLM's config set them.
CAPTURE_SIZES = "capture_sizes"
# + ".<group>": rows of the shared forward-pass block table past the rows handed to
# attention that hold a block id (adapters.probes.filled_rows_past)
ROWS_PAST = "attn.filled_rows_past"
# Stages a user may switch off; lifecycle always runs.
OPTIONAL_STAGES = (GATHER, PREPARE, PARTITION, DUMMY)


@dataclass(frozen=True)
class FieldObs:
    """One output field. ``kind`` is torch / numpy / scalar / list / none."""

    kind: str
    dtype: str  # "int64", "int32", "bool", "" for non-arrays
    shape: tuple[int, ...]
    values: Any  # np.ndarray for arrays, the value itself otherwise


@dataclass(frozen=True)
class ErrorObs:
    """An exception raised by vLLM code; never lost, never re-raised."""

    type: str
    message: str
    req_ids: tuple[str, ...]


@dataclass
class StageObs:
    stage: str
    # PCP rank for partition (dcp_rank too under DCP > 1)
    rank: int | None = None
    dcp_rank: int = 0
    fields: dict[str, FieldObs] = field(default_factory=dict)
    duration_s: float = 0.0
    error: ErrorObs | None = None
    # Top-level field names the installed type declares (plus the harness's own
    # extra groups, e.g. "manager"); None when unknown (a hand-built observation).
    # A contract field whose root is not declared is a release difference, not
    # a missing value.
    declared: frozenset[str] | None = None


@dataclass
class StepObs:
    """Everything one step produced; ``stages`` in execution order."""

    index: int
    stages: list[StageObs] = field(default_factory=list)
    # Wall seconds inside the installed vLLM's own calls for this step: the whole
    # execute_model (prepare_attn's kernels, staged writes and its own glue
    # included, the probes' bookkeeping excluded), the other ranks, sample_tokens,
    # the dummy run, and the runner's build (vLLM's constructors), profile run and
    # capture before a runner's first step.
    # The stage rows' durations are the probed parts of it.
    vllm_s: float = 0.0
    # The earlier step at which vLLM raised on this runner (None: none did). vLLM is
    # not exception-safe (a call may stop half-way, e.g. block ids staged and never
    # applied), so a step after it runs on a runner in an unknown state.
    after_exception: int | None = None
    # What vLLM's own sampler computed on a batch with sampling parameters: the logit rows'
    # request ids and positions, and its SampledRows (simrig/vllm_sampling/switch.py)
    sampled: Any = None

    def get(self, stage: str, rank: int | None = None) -> StageObs | None:
        for obs in self.stages:
            if obs.stage == stage and obs.rank == rank and obs.dcp_rank == 0:
                return obs
        return None

    def step_failed(self) -> bool:
        """A stage of the step itself raised: not the profile run or capture
        before it, not the dummy run after it."""
        return any(s.error is not None for s in self.stages if s.stage not in (CAPTURE, DUMMY, PROFILE))

    def all(self, stage: str) -> list[StageObs]:
        """Every observation of ``stage`` (DCP rank 0 only: the PCP view)."""
        return [s for s in self.stages if s.stage == stage and s.dcp_rank == 0]

    @property
    def errors(self) -> list[StageObs]:
        return [s for s in self.stages if s.error is not None]


_TORCH_DTYPE_NAMES: dict[Any, str] = {}  # torch.int64 -> "int64", filled on first sight


def observe_value(value: Any) -> FieldObs:
    """Copy one value into a FieldObs."""
    # torch is imported lazily so this module stays usable without it.
    if type(value).__module__.startswith("torch") and hasattr(value, "dtype"):
        try:
            # a host tensor outside autograd (every runner buffer): a view, then one copy;
            # this is the hot path -- a campaign observes hundreds of fields per step
            arr = value.numpy().copy()
        except (RuntimeError, TypeError):  # on a device, or requiring grad
            arr = value.detach().cpu().numpy().copy()
        name = _TORCH_DTYPE_NAMES.get(value.dtype)
        if name is None:
            name = _TORCH_DTYPE_NAMES[value.dtype] = str(value.dtype).removeprefix("torch.")
        return FieldObs("torch", name, arr.shape, arr)
    if isinstance(value, np.ndarray):
        return FieldObs("numpy", value.dtype.name, value.shape, value.copy())
    if value is None:
        return FieldObs("none", "", (), None)
    if isinstance(value, str):
        return FieldObs("scalar", "str", (), value)
    if isinstance(value, (bool, int, float, np.generic)):
        return FieldObs("scalar", type(value).__name__, (), value)
    if isinstance(value, (list, tuple)):
        return FieldObs("list", "", (len(value),), list(value))
    return FieldObs("object", type(value).__name__, (), None)


def declared_fields(obj: Any) -> frozenset[str]:
    """The field names a dataclass or NamedTuple's type declares."""
    if dataclasses.is_dataclass(obj):
        return frozenset(f.name for f in dataclasses.fields(obj))
    return frozenset(getattr(obj, "_fields", ()))


def observe_fields(obj: Any, prefix: str = "") -> dict[str, FieldObs]:
    """Observe every field of a dataclass or NamedTuple (nested ones flattened
    as ``outer.inner``)."""
    if dataclasses.is_dataclass(obj):
        items = ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    elif hasattr(obj, "_asdict"):
        items = obj._asdict().items()
    else:
        raise TypeError(f"cannot observe {type(obj).__name__}")
    out: dict[str, FieldObs] = {}
    for name, value in items:
        key = prefix + name
        if dataclasses.is_dataclass(value) or hasattr(value, "_asdict"):
            out.update(observe_fields(value, key + "."))
        else:
            out[key] = observe_value(value)
    return out


def handed_to_scheduler(obs: StepObs) -> dict[str, list]:
    """The tokens sample_tokens handed the scheduler, per request (none if it failed)."""
    post = obs.get(POSTPROCESS)
    if post is None or post.error is not None:
        return {}
    ids, tokens = post.fields.get("output.req_ids"), post.fields.get("output.sampled_token_ids")
    if ids is None or tokens is None or ids.kind != "list" or tokens.kind != "list":
        return {}
    return {str(r): list(t) for r, t in zip(ids.values, tokens.values)}
