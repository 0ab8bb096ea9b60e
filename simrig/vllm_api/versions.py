"""Differences between vLLM releases at the entry points simrig drives: the one place.

Every MRV2 release from 0.30.0 on is driven through the same Step stream. What differs is
read off the installed code (parameters and dataclass fields), never off the version string
(``detect_shape``; its docstring tables every difference and what simrig does about it).
A capability a release lacks is an ``Unavailable``; each release's own ``execute_model``
calls its own functions, and the harness only partitions the ranks past 0 the way that
release does (``partition_for_rank``). See docs/releases.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from simrig.vllm_api.entry_points import VllmApiError  # one error type for all drift

MODEL_RUNNER = "vllm.v1.worker.gpu.model_runner"
PCP_MANAGER = "vllm.v1.worker.gpu.pcp_manager"
SCHED_OUTPUT = "vllm.v1.core.sched.output"
STATES = "vllm.v1.worker.gpu.states"

# Capability names (what a trace may need that a release may lack).
PCP_SHARD_DECODE = "pcp_shard_decode_requests"

# Required dataclass fields simrig does not set itself, with the value that
# means "nothing": num_common_prefix_blocks is required in 0.30/0.31 and only
# feeds cascade attention, which the input path does not build.
KNOWN_FILLERS: dict[str, dict[str, Callable[[], Any]]] = {
    "SchedulerOutput": {"num_common_prefix_blocks": list},
    "NewRequestData": {},
    "CachedRequestData": {},
}


class Unavailable(NamedTuple):
    """A stage simrig cannot drive on the installed release."""

    stage: str
    capability: str
    reason: str

    def line(self) -> str:
        return f"{self.stage} ({self.capability}): {self.reason}"


@dataclass(frozen=True)
class ApiShape:
    """How to call the installed release; detected once per process."""

    version: str
    prepare_takes_num_active_loras: bool
    partition_takes_batch_desc: bool
    pcp_shard_decode: bool
    pcp_capture_staging: bool = False
    # BlockTables.gather_block_tables nulls a sliding-window group's entries
    # wholly below the window of each request's first scheduled token (doctor
    # prints it; the checks never read it: they judge every release by it).
    nulls_below_window: bool = False
    # vLLM's streaming input: the scheduler re-sends a resumable request the runner
    # still holds as new with its next input, and add_requests removes the old state first
    streaming_input: bool = False
    fillers: dict[str, dict[str, Callable[[], Any]]] = field(default_factory=dict)
    optional_fields: dict[str, frozenset[str]] = field(default_factory=dict)

    def unavailable(self, *, pcp_size: int, shard_decode_requests: bool) -> list[Unavailable]:
        """The stages a run with this PCP configuration cannot drive here."""
        out = []
        if pcp_size > 1 and shard_decode_requests and not self.pcp_shard_decode:
            out.append(Unavailable(
                "partition", PCP_SHARD_DECODE,
                f"vLLM {self.version}: {PCP_MANAGER}.PCPManager has no parameter "
                "shard_decode_requests (decode sharding appeared in 0.32)"))
        return out

    def capabilities(self) -> dict[str, bool]:
        return {PCP_SHARD_DECODE: self.pcp_shard_decode}

    def describe(self) -> list[str]:
        """One line per difference, as doctor prints them."""
        return [
            "prepare_inputs(..., num_active_loras)" if self.prepare_takes_num_active_loras
            else "prepare_inputs(scheduler_output, batch_req_state, batch_desc) (no LoRA count)",
            "partition_batch(input_batch, batch_desc)" if self.partition_takes_batch_desc
            else "partition_batch(input_batch, padded_num_tokens, padded_num_reqs)",
            "PCP capture dummies staged by prepare_inputs_for_capture_or_profile"
            if self.pcp_capture_staging else "PCP capture dummies used as make_dummy builds them "
                                             "(no prepare_inputs_for_capture_or_profile)",
            "BlockTables nulls sliding-window entries below the window" if self.nulls_below_window
            else "BlockTables gathers sliding-window rows as sent (no sliding_window_reach)",
            "streaming input: add_requests replaces a live request's state (a streaming update)"
            if self.streaming_input else "no streaming input: a live id sent as new is only a duplicate",
            *(f"SchedulerOutput: required {name} filled with an empty value"
              for name in self.fillers.get("SchedulerOutput", {})),
        ]


def _api_error(module: str, attribute: str, version: str, problem: str) -> Exception:

    return VllmApiError(module, attribute, version, problem)


def _params(obj: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return {}


def _required_unknown(params: dict[str, inspect.Parameter], passed: set[str]) -> list[str]:
    """Parameters without a default that simrig does not pass."""
    return [name for name, p in params.items()
            if name not in passed and name not in ("self", "cls")
            and p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_call(module: str, attribute: str, obj: Any, passed: set[str], version: str) -> None:
    """Raise VllmApiError when ``obj`` requires a parameter simrig does not pass."""
    unknown = _required_unknown(_params(obj), passed)
    if unknown:
        raise _api_error(module, attribute, version,
                         f"required parameter(s) {', '.join(unknown)} unknown to simrig "
                         "(a signature change the adapter does not handle)")


def _dataclass_fillers(module: str, cls: Any, passed: set[str], version: str
                       ) -> tuple[dict[str, Callable[[], Any]], frozenset[str]]:
    """(fillers for required fields simrig does not set, the class's field names)."""
    name = cls.__name__
    known = KNOWN_FILLERS.get(name, {})
    fill: dict[str, Callable[[], Any]] = {}
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        required = (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                    and f.init)
        if required and f.name not in passed:
            if f.name not in known:
                raise _api_error(module, f"{name}.{f.name}", version,
                                 "required field unknown to simrig (a change the adapter "
                                 "does not handle)")
            fill[f.name] = known[f.name]
    missing = passed - names
    if missing:
        raise _api_error(module, f"{name}.{sorted(missing)[0]}", version,
                         "field not found (a change the adapter does not handle)")
    return fill, frozenset(names)


# The keyword arguments simrig passes, per constructor (see runner.VllmApi).
SCHEDULER_OUTPUT_ARGS = {"scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                         "total_num_scheduled_tokens", "scheduled_spec_decode_tokens",
                         "scheduled_encoder_inputs", "finished_req_ids",
                         "free_encoder_mm_hashes", "preempted_req_ids"}
NEW_REQUEST_ARGS = {"req_id", "prompt_token_ids", "mm_features", "sampling_params",
                    "pooling_params", "block_ids", "num_computed_tokens", "lora_request",
                    "prefill_token_ids"}
CACHED_REQUEST_ARGS = {"req_ids", "resumed_req_ids", "new_token_ids", "all_token_ids",
                       "new_block_ids", "num_computed_tokens", "num_output_tokens"}
PCP_MANAGER_ARGS = {"pcp_world_size", "pcp_rank", "device", "shard_decode_requests",
                    "max_num_reqs", "max_num_tokens", "dcp_world_size", "dcp_rank", "cp_interleave"}
REQUEST_STATE_ARGS = {"max_num_reqs", "max_model_len", "max_num_batched_tokens",
                      "num_speculative_steps", "vocab_size", "device"}


def detect_shape(version: str, *, runner_cls: Any, pcp_cls: Any, request_state_cls: Any,
                 scheduler_output_cls: Any, new_request_cls: Any, cached_request_cls: Any,
                 block_tables_cls: Any = None) -> ApiShape:
    """Read the installed release's call shapes; VllmApiError on a shape simrig does not know.

    Every MRV2 release from 0.30.0 on is driven through the same Step stream. What
    differs between releases is read off the installed code (parameters and
    dataclass fields), never off the version string, so a source checkout of a
    newer vLLM is handled by what it offers:

        difference (module.attribute)                   0.30 0.31 0.32 0.33   simrig does
        ──────────────────────────────────────────────  ──── ──── ──── ────   ──────────────────────────
        GPUModelRunner.prepare_inputs(num_active_loras)   -    +    +    +    nothing: execute_model calls it
        PCPManager.partition_batch(input, batch_desc)     -    +    +    +    ranks past 0: as the release's
                                                                               prepare_inputs does (0.30: the
                                                                               module's maybe_partition_pcp_batch)
        PCPManager(shard_decode_requests)                 -    -    +    +    capability: without it the
                                                                               partition stage of a sharding
                                                                               trace is *unavailable*
        PCPManager.prepare_inputs_for_capture_or_         -    -    -    +    capture dummies under PCP are
          profile                                                              staged where present, else
                                                                               compared as make_dummy built them
        BlockTables(sliding_window_reach)                 -    -    -    +    passed for sliding-window groups where
                                                                               present; the blocks oracle expects the
                                                                               entries below the window null on every
                                                                               release (0.30-0.32 keep them: a known
                                                                               finding, the bug 0.33 fixed)
        SchedulerOutput.num_common_prefix_blocks        req  req  opt  opt    filled with [] when required
        streaming input: v1.request.StreamingUpdate,      +    +    +    +    nothing: a streaming update is a
          GPUModelRunner.add_requests removes a live                           NewRequestData with the live id
          id first ("Streaming input update")                                  (Step NewRequest.streaming); the
                                                                               valid contract holds it on every
                                                                               release where present (doctor
                                                                               prints it; where absent a live id
                                                                               sent as new is only a duplicate)
        LoRA dispatch: lora_utils (LoraState,             +    +    +    +    nothing: the same in every release
          get_lora_capture_cases), LoRAConfig.                                  (0.30.0 execute_model counts and
          specialize_active_lora, CompilationConfig.                            dispatches adapters as 0.33.0 does;
          cudagraph_specialize_lora, descriptor's                               only prepare_inputs lacks the count)
          num_active_loras
        any other required parameter or field simrig does not pass           -> VllmApiError (one line)

    A capability the installed release lacks is an ``Unavailable`` (stage,
    capability, reason): doctor lists it, a replay reports it per trace and runs
    every other stage. Call-shape differences never reach the runner: each release's own
    ``execute_model`` calls its own functions with its own arguments; the harness
    only partitions the ranks past 0 the way that release does
    (``partition_for_rank``).
    """
    prepare = _params(runner_cls.prepare_inputs)
    loras = "num_active_loras" in prepare
    check_call(MODEL_RUNNER, "GPUModelRunner.prepare_inputs", runner_cls.prepare_inputs,
               {"scheduler_output", "batch_req_state", "batch_desc", "num_active_loras"}, version)

    partition = _params(pcp_cls.partition_batch)
    if "batch_desc" in partition:
        takes_desc = True
    elif "padded_num_tokens" in partition and "padded_num_reqs" in partition:
        takes_desc = False
    else:
        raise _api_error(PCP_MANAGER, "PCPManager.partition_batch", version,
                         "signature has neither batch_desc nor padded_num_tokens/padded_num_reqs "
                         "(a call shape the adapter does not know)")
    check_call(PCP_MANAGER, "PCPManager.partition_batch", pcp_cls.partition_batch,
               {"input_batch", "batch_desc", "padded_num_tokens", "padded_num_reqs"}, version)

    shard = "shard_decode_requests" in _params(pcp_cls)
    staging = callable(getattr(pcp_cls, "prepare_inputs_for_capture_or_profile", None))
    check_call(PCP_MANAGER, "PCPManager", pcp_cls, PCP_MANAGER_ARGS, version)
    check_call(STATES, "RequestState", request_state_cls, REQUEST_STATE_ARGS, version)

    fillers, optional = {}, {}
    for cls, passed in ((scheduler_output_cls, SCHEDULER_OUTPUT_ARGS),
                        (new_request_cls, NEW_REQUEST_ARGS),
                        (cached_request_cls, CACHED_REQUEST_ARGS)):
        fill, names = _dataclass_fillers(SCHED_OUTPUT, cls, passed, version)
        fillers[cls.__name__] = fill
        optional[cls.__name__] = names
    nulls = block_tables_cls is not None and "sliding_window_reach" in _params(block_tables_cls)
    return ApiShape(version=version, prepare_takes_num_active_loras=loras,
                    partition_takes_batch_desc=takes_desc, pcp_shard_decode=shard,
                    pcp_capture_staging=staging, nulls_below_window=nulls, fillers={k: v for k, v in fillers.items() if v},
                    optional_fields=optional, streaming_input=streaming_input(runner_cls))


def streaming_input(runner_cls: Any) -> bool:
    """Whether the installed release has streaming input: the scheduler's
    ``StreamingUpdate`` and an ``add_requests`` that removes a live request before
    re-adding it (its source calls ``_remove_request``), read off the code."""
    try:
        has_update = hasattr(importlib.import_module("vllm.v1.request"), "StreamingUpdate")
        source = inspect.getsource(runner_cls.add_requests)
    except (ImportError, OSError, TypeError, AttributeError):
        return False
    return has_update and "self._remove_request(" in source


def filled(shape: ApiShape, cls_name: str) -> dict[str, Any]:
    """Fresh values for the required fields simrig fills on this release."""
    return {name: make() for name, make in shape.fillers.get(cls_name, {}).items()}


def pcp_kwargs(shape: ApiShape, shard_decode_requests: bool, pcp_cls: Any = None,
               parallel_config: Any = None) -> dict[str, Any]:
    """The PCPManager keyword arguments vLLM's own builder derives from the
    parallel config (pcp_manager.maybe_build_pcp_manager), where the installed
    class takes them: ``cp_interleave`` (0.30+, ``cp_kv_cache_interleave_size``)
    and ``moe_gathers_tokens`` (0.33: "Without EP all2all kernels, MoERunner
    all-gathers PCP tokens to route"). ``shard_decode_requests`` (0.32+) is the
    trace's own setting, which may differ from what the parallel config derives.
    """
    kwargs: dict[str, Any] = {}
    if shape.pcp_shard_decode:
        kwargs["shard_decode_requests"] = shard_decode_requests
    params = _params(pcp_cls) if pcp_cls is not None and parallel_config is not None else {}
    if "cp_interleave" in params:
        kwargs["cp_interleave"] = parallel_config.cp_kv_cache_interleave_size
    if "moe_gathers_tokens" in params:
        kwargs["moe_gathers_tokens"] = not parallel_config.enable_expert_parallel
    return kwargs


# ------------------------------------------------------------- rank calls
def partition_for_rank(shape: ApiShape, manager: Any, input_batch: Any, batch_desc: Any) -> Any:
    """Partition the global batch for a PCP rank the runner does not drive, the
    way the installed release's prepare_inputs partitions rank 0's: 0.31+
    ``manager.partition_batch(input_batch, batch_desc)``, 0.30 the module's own
    ``maybe_partition_pcp_batch(manager, input_batch, batch_desc)`` (which
    derives the padded sizes from the descriptor)."""
    if shape.partition_takes_batch_desc:
        return manager.partition_batch(input_batch, batch_desc)

    return importlib.import_module(PCP_MANAGER).maybe_partition_pcp_batch(
        manager, input_batch, batch_desc)
