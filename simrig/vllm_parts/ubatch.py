"""Micro-batching (DBO): vLLM's own split decision and slicing, on the batch a step ran.

vLLM's ``UBatchRunner`` cannot be built in this process (it needs DP > 1 and CUDA streams),
but the part at the scheduler/runner boundary needs neither: ``DispatchTap`` records what
``execute_model`` hands to ``dispatch_cg_and_sync_dp``, and after the step ``decide`` and
``split`` make the same calls a DBO rank would make, with vLLM's own functions looked up at
call time (``install_dispatch_tap``'s docstring has the flow). See docs/oracle.md,
'Micro-batches'.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from simrig import observe as obs
from simrig.vllm_runtime import platform

_DISPATCH = "dispatch_cg_and_sync_dp"
_DP_UTILS = "vllm.v1.worker.gpu.dp_utils"
_UBATCH = "vllm.v1.worker.gpu.ubatch_utils"
_TAPPED = "__simrig_dispatch_tap__"


class DispatchTap:
    """The calls execute_model makes to ``dispatch_cg_and_sync_dp`` while armed."""

    def __init__(self) -> None:
        self.calls: list[inspect.BoundArguments] = []
        self.armed = False


_TAP = DispatchTap()


def install_dispatch_tap(runner: Any) -> DispatchTap:
    """Shadow the model runner module's ``dispatch_cg_and_sync_dp`` (execute_model reads
    it from its module's globals) with a wrapper that records the bound arguments while
    the tap is armed, and calls dp_utils' current function (a mutant's, if one is applied).

    vLLM's ``UBatchRunner`` cannot be built in this process: ``maybe_build_ubatch_runner``
    returns None unless ``data_parallel_size > 1``, and its constructor takes CUDA streams
    (``torch.cuda.Stream``) that a CPU build of torch does not have; its threads hand off on
    CUDA events (``vllm.v1.worker.ubatching``). Those are the collectives and streams; the
    part that touches the scheduler/runner boundary does not need them:

        execute_model --dispatch_cg_and_sync_dp(..., uniform_decode=...)--> the split decision
        UBatchRunner.prepare --create_ubatch_slices--> the slices
                             --_slice_input_batch---> each micro-batch's InputBatch

    So the tap records the arguments ``execute_model`` hands to ``dispatch_cg_and_sync_dp``
    (the ``uniform_decode`` flag among them), and after the step the same call is made again
    as a DBO rank would make it: ``allow_ubatching=True``, a second DP rank running the same
    batch (vLLM's own ``skip_dp_coordination`` stands in for the all-reduce: every rank's row
    is this rank's), and a ``ParallelConfig`` with the trace's micro-batch settings. Where
    vLLM's decision splits, vLLM's ``create_ubatch_slices`` and ``_slice_input_batch`` split the
    batch the forward ran, as ``UBatchRunner.prepare`` would. Every function is looked up at
    call time, so a mutated vLLM is what runs.
    """
    module = sys.modules[type(runner).__module__]
    current = getattr(module, _DISPATCH, None)
    if current is None or getattr(current, _TAPPED, False):
        return _TAP
    dp_utils = sys.modules.get(_DP_UTILS) or __import__(_DP_UTILS, fromlist=["_"])

    def tapped(*args: Any, **kwargs: Any) -> Any:
        fn = getattr(dp_utils, _DISPATCH, current)
        if _TAP.armed:
            _TAP.calls.append(inspect.signature(fn).bind(*args, **kwargs))
        return fn(*args, **kwargs)

    setattr(tapped, _TAPPED, True)
    setattr(module, _DISPATCH, tapped)
    return _TAP


def uniform_decode_flag(call: inspect.BoundArguments | None) -> bool | None:
    """The ``uniform_decode`` execute_model passed (None: no call recorded)."""
    if call is None:
        return None
    return bool(call.arguments.get("uniform_decode", False))


def _parallel_config(runner: Any, num_ubatches: int, decode_threshold: int,
                     prefill_threshold: int) -> Any:
    """vLLM's ParallelConfig with the trace's micro-batch settings (its own validator
    holds the thresholds to at least the number of micro-batches)."""
    from vllm.config import ParallelConfig  # lazy: vllm loads after platform.configure() sets its env

    dbo = dict(enable_dbo=True) if num_ubatches == 2 else dict(ubatch_size=num_ubatches)
    return ParallelConfig(prefill_context_parallel_size=runner.parallel_config.prefill_context_parallel_size,
                          dbo_decode_token_threshold=decode_threshold,
                          dbo_prefill_token_threshold=prefill_threshold, **dbo)


def decide(runner: Any, call: inspect.BoundArguments, num_ubatches: int, decode_threshold: int,
           prefill_threshold: int) -> Any:
    """vLLM's own dispatch with DP agreement, as a DBO rank runs it: the descriptor
    (``num_ubatches`` > 1: the step is split)."""
    # lazy: vllm loads after platform.configure() sets its env
    import vllm.v1.worker.dp_utils as worker_dp_utils

    dp_utils = sys.modules[_DP_UTILS]
    args = dict(call.arguments)
    args.update(dp_size=2, dp_rank=0, allow_ubatching=True, dp_sync_state=None,
                parallel_config=_parallel_config(runner, num_ubatches, decode_threshold,
                                                 prefill_threshold))
    fn = getattr(dp_utils, _DISPATCH)
    accepted = inspect.signature(fn).parameters
    # the stand-in for the DP all-reduce: vLLM's own skip (every rank runs this batch);
    # the group handle 0.30.0-0.32.0 look up first is a one-process group
    with worker_dp_utils.skip_dp_coordination(), platform.dp_group(2):
        desc, _ = fn(**{k: v for k, v in args.items() if k in accepted})
    return desc


def split(runner: Any, input_batch: Any, num_ubatches: int) -> dict[str, obs.FieldObs]:
    """``create_ubatch_slices`` and ``_slice_input_batch`` on ``input_batch`` (the batch
    the forward ran), each micro-batch with its own buffers as ``UBatchRunner`` keeps
    them; the observed fields, one list entry per micro-batch."""
    import torch  # lazy: torch loads only when this runs

    ubatch_utils = sys.modules.get(_UBATCH) or __import__(_UBATCH, fromlist=["_"])
    slices = ubatch_utils.create_ubatch_slices(input_batch, num_ubatches)
    size = int(input_batch.num_reqs_after_padding) + 1
    dcp_size = int(getattr(runner, "dcp_size", 1))
    fields: dict[str, list[Any]] = {name: [] for name in UBATCH_FIELDS}
    for s in slices:
        fields["slice.requests"].append([s.request_slice.start, s.request_slice.stop])
        fields["slice.tokens"].append([s.token_slice.start, s.token_slice.stop])
        sub = ubatch_utils._slice_input_batch(
            input_batch, s, torch.zeros(size, dtype=torch.int32), torch.zeros(size, dtype=torch.int32),
            torch.zeros(size, dtype=torch.int32) if dcp_size > 1 else None,
            dcp_size=dcp_size, dcp_rank=int(getattr(runner, "dcp_rank", 0)),
            cp_interleave=int(getattr(runner, "cp_interleave", 1)))
        for name in UBATCH_FIELDS[2:]:
            value = getattr(sub, name, None)
            if value is not None and not isinstance(value, (int, list)):
                value = obs.observe_value(value).values.tolist()  # a tensor or array, as a list
            fields[name].append(list(value) if isinstance(value, list) else value)
    return {name: obs.observe_value(values) for name, values in fields.items()}


# The sub-batch fields observed (after the two slice fields): what the micro-batch's
# attention metadata and forward read.
UBATCH_FIELDS = ("slice.requests", "slice.tokens", "req_ids", "num_reqs", "num_reqs_after_padding",
                 "num_tokens", "num_tokens_after_padding", "query_start_loc", "query_start_loc_np",
                 "num_scheduled_tokens", "seq_lens", "seq_lens_cpu_upper_bound", "dcp_local_seq_lens",
                 "positions", "is_padding", "idx_mapping_np")
