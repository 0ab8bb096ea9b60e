"""The vLLM adapter's runner side (one of the four rooms that may import vllm: ``simrig.adapters``).

It detects the installed version, checks that every entry point simrig drives
exists with the parameters it calls, maps a vLLM-agnostic ``Step`` to the
installed ``SchedulerOutput``, and builds a model-less runner whose methods
are the installed ``GPUModelRunner``'s own.

API drift is reported as one ``VllmApiError`` naming module, attribute and
version, never as a bare AttributeError deep inside a replay.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from simrig.adapters import pp_peer, wiring
from simrig.step import RunnerConfig, Step, block_groups
from simrig.vllm_api import versions
from simrig.vllm_api.entry_points import ENTRY_POINTS, EntryPoint, VllmApiError, VllmUnavailable  # noqa: F401 -- the adapter's public names
from simrig.vllm_parts import cudagraph, lora
from simrig.vllm_parts.vllm_config import vllm_config_for
from simrig.vllm_runtime import platform
from simrig.vllm_sampling.sampling_params import sampling_params


def _vllm_version() -> str:
    try:
        return version("vllm")
    except Exception:  # an editable checkout without metadata
        mod = importlib.import_module("vllm")
        return getattr(mod, "__version__", "unknown")


def _import_vllm() -> platform.PlatformChoice:
    """Pick the platform, import vllm, apply the post-import plumbing."""
    choice = platform.configure()
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError and anything vLLM raises at import
        raise VllmUnavailable(f"vllm is not importable: {type(exc).__name__}: {exc}") from None
    platform.apply_after_import()
    return choice


def _resolve(ep: EntryPoint, version: str) -> Any:
    try:
        obj: Any = importlib.import_module(ep.module)
    except ImportError as exc:
        raise VllmApiError(ep.module, ep.attribute, version, f"module not importable ({exc})")
    for part in ep.attribute.split("."):
        if not hasattr(obj, part):
            raise VllmApiError(ep.module, ep.attribute, version, f"attribute {part!r} not found")
        obj = getattr(obj, part)
    if ep.params:
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            return obj
        missing = [p for p in ep.params if p not in sig.parameters]
        if missing:
            raise VllmApiError(ep.module, ep.attribute, version,
                               f"signature lacks parameter(s) {', '.join(missing)}")
    return obj


@dataclass(frozen=True)
class RunnerParts:
    """A model-less runner and what is driven next to it (``VllmApi.build_parts``)."""

    runner: Any
    pcp_managers: list[Any]  # one per PCP rank (empty without PCP); rank 0's is on the runner
    dcp_peers: list[tuple[int, int, Any]]  # (pcp_rank, dcp_rank, manager) for DCP ranks past 0
    dispatcher: Any  # vLLM's CudaGraphManager, also runner.cudagraph_manager
    dummy_buffers: Any  # InputBuffers of the dummy runs
    # pp_size > 1: the non-last PP rank's runner and the broadcast between the ranks
    # (adapters/pp_peer.py); the runner above is then the last rank
    pp_peer: Any = None
    pp_mailbox: Any = None


@dataclass(frozen=True)
class EntryPointStatus:
    entry_point: EntryPoint
    ok: bool
    problem: str = ""


class VllmApi:
    """Handles on the installed vLLM's classes and functions simrig drives."""

    def __init__(self) -> None:
        choice = _import_vllm()
        self.version = _vllm_version()
        self.platform = choice
        resolved = {ep.attribute: _resolve(ep, self.version) for ep in ENTRY_POINTS}
        # lazy: vllm and torch load after platform.configure() sets the env
        import torch
        from vllm.config import CUDAGraphMode
        from vllm.sampling_params import SamplingParams

        self.torch = torch
        self.device = torch.device(choice.device)
        self.GPUModelRunner = importlib.import_module(
            "vllm.v1.worker.gpu.model_runner").GPUModelRunner
        self.sort_batch_req_ids = resolved["sort_batch_req_ids"]
        self.InputBatch = importlib.import_module("vllm.v1.worker.gpu.input_batch").InputBatch
        self.InputBuffers = resolved["InputBuffers"]
        self.get_num_sampled_and_rejected = resolved["get_num_sampled_and_rejected"]
        self.RequestState = resolved["RequestState"]
        self.PCPManager = resolved["PCPManager"]
        self.BatchExecutionDescriptor = resolved["BatchExecutionDescriptor"]
        self.SchedulerOutput = resolved["SchedulerOutput"]
        self.NewRequestData = resolved["NewRequestData"]
        self.CachedRequestData = resolved["CachedRequestData"]
        self.CUDAGraphMode = CUDAGraphMode
        self.SamplingParams = SamplingParams
        self.shape = _detect_shape(self.version, resolved, self.GPUModelRunner)
        self._fill_so = versions.filled(self.shape, "SchedulerOutput")

    # ------------------------------------------------------------------ mapping
    def scheduler_output(self, step: Step, num_kv_groups: int = 1) -> Any:
        """The installed version's SchedulerOutput carrying ``step``: block ids
        as one list per KV cache group."""
        groups = num_kv_groups
        new_reqs = []
        for req in step.new_requests:
            all_ids = req.prefill_token_ids()
            new_reqs.append(self.NewRequestData(
                req_id=req.req_id,
                prompt_token_ids=all_ids[: req.prompt_len],
                mm_features=[],
                sampling_params=sampling_params(self.SamplingParams, req.sampling, req.max_tokens),
                pooling_params=None,
                block_ids=tuple(block_groups(req.block_ids, groups)),
                num_computed_tokens=req.num_computed_tokens,
                lora_request=lora.lora_request(req.lora_id),
                prefill_token_ids=all_ids,
            ))
        cached = self.CachedRequestData(
            req_ids=[c.req_id for c in step.cached],
            resumed_req_ids={c.req_id for c in step.cached if c.resumed},
            new_token_ids=[[] for _ in step.cached],
            all_token_ids={},
            new_block_ids=[tuple(block_groups(c.new_block_ids, groups))
                           if c.new_block_ids is not None else None for c in step.cached],
            num_computed_tokens=[c.num_computed_tokens for c in step.cached],
            num_output_tokens=[0 for _ in step.cached],
        )
        return self.SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(step.num_scheduled_tokens),
            total_num_scheduled_tokens=step.total_num_scheduled_tokens,
            scheduled_spec_decode_tokens={k: [-1] * n for k, n in step.spec_tokens.items() if n},
            scheduled_encoder_inputs={},
            finished_req_ids=set(step.finished),
            free_encoder_mm_hashes=[],
            preempted_req_ids=set(step.preempted) or None,
            **self._fill_so,
        )

    def batch_descriptor(self, num_tokens: int) -> Any:
        """Eager execution (no cudagraph): no token or request padding."""
        return self.BatchExecutionDescriptor(
            cg_mode=self.CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=None)

    def build_dispatcher(self, config: RunnerConfig) -> Any:
        """vLLM's CudaGraphManager for ``config``'s mode and capture sizes (see
        ``simrig.vllm_parts.cudagraph``); drift is one VllmApiError."""
        try:
            return cudagraph.dispatcher_for(config)
        except (AttributeError, TypeError, ImportError) as exc:
            raise VllmApiError("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager", self.version,
                               f"cannot build the dispatcher without a GPU ({type(exc).__name__}: "
                               f"{exc})") from None

    def prepare_for_capture(self, manager: Any, batch: Any) -> Any:
        """PCP's capture/profile staging of a dummy batch (from 0.33; see versions.py)."""
        if not self.shape.pcp_capture_staging:
            return batch
        return manager.prepare_inputs_for_capture_or_profile(batch)

    # ------------------------------------------------------------------- runner
    def build_runner(self, config: RunnerConfig, dispatcher: Any = None,
                     pcp_manager: Any = None, block_tables: Any = None) -> Any:
        """A GPUModelRunner without a model whose own execute_model runs.

        ``__init__`` needs CUDA streams and a model, so the runner is created
        with ``__new__`` and given the attributes execute_model reads
        (``simrig.adapters.wiring``); ``pcp_manager`` is PCP rank 0's.
        Collaborators off the boundary are stand-ins (see docs/standins.md).
        """
        runner = self.GPUModelRunner.__new__(self.GPUModelRunner)
        return wiring.equip(runner, config, self.device,
                            dispatcher if dispatcher is not None else self.build_dispatcher(config),
                            pcp_manager, block_tables, request_state=self.RequestState,
                            input_buffers=self.InputBuffers)

    def build_parts(self, config: RunnerConfig) -> RunnerParts:
        """Everything one harness drives for ``config``, built in vLLM's order:
        the block tables first (the PCP managers and the runner share them),
        then every PCP rank's and DCP peer's manager, the dispatcher, the
        runner (PCP rank 0's manager on it) and the dummy runs' own buffers."""
        block_tables = self.build_block_tables(config)
        pcp_managers = self.build_pcp_managers(config, block_tables)
        dcp_peers = self.build_dcp_peer_managers(config, block_tables)
        dispatcher = self.build_dispatcher(config)
        runner = self.build_runner(config, dispatcher, pcp_managers[0] if pcp_managers else None,
                                   block_tables)
        runner.model.names.peers = pcp_managers[1:]  # each PCP rank's own share in the all-gather
        peer, mailbox = self.build_pp_peer(config, runner) if config.pp_size > 1 else (None, None)
        return RunnerParts(runner, pcp_managers, dcp_peers, dispatcher, self.dummy_buffers(config),
                           peer, mailbox)

    def build_pp_peer(self, config: RunnerConfig, last: Any) -> tuple[Any, Any]:
        """PP: ``last`` becomes the last rank, and a second runner, built and
        equipped the same way (its own block tables, dispatcher and PCP rank 0
        manager), PP rank 0; both get vLLM's own PPHandler, and the broadcast
        between them is the mailbox (adapters/pp_peer.py)."""
        mailbox = pp_peer.BroadcastMailbox()
        tables = self.build_block_tables(config)
        managers = self.build_pcp_managers(config, tables)
        peer = self.build_runner(config, self.build_dispatcher(config),
                                 managers[0] if managers else None, tables)
        for rank, runner in ((config.pp_size - 1, last), (0, peer)):
            pp_peer.make_pipeline_rank(runner, rank, config.pp_size, mailbox,
                                       num_speculative_steps=config.num_speculative_tokens,
                                       device=self.device)
        return peer, mailbox

    def build_block_tables(self, config: RunnerConfig) -> Any:
        """vLLM's BlockTables for the trace config's KV cache groups."""
        return wiring.block_tables(config, self.device)

    def build_pcp_managers(self, config: RunnerConfig, block_tables: Any = None) -> list[Any]:
        """One real PCPManager per PCP rank (empty when pcp_size == 1, or when
        the installed release cannot drive this PCP configuration: see
        ``unavailable``)."""
        if config.pcp_size <= 1 or self.unavailable(config):
            return []
        return [self._pcp_manager(config, rank, 0, block_tables) for rank in range(config.pcp_size)]

    def build_dcp_peer_managers(self, config: RunnerConfig, block_tables: Any = None
                                ) -> list[tuple[int, int, Any]]:
        """``(pcp_rank, dcp_rank, manager)`` for every DCP rank past 0: DCP
        shards the KV cache, not the queries, so each must partition the batch
        exactly as DCP rank 0 of its PCP rank does."""
        if config.pcp_size <= 1 or config.dcp_size <= 1 or self.unavailable(config):
            return []
        return [(rank, dcp_rank, self._pcp_manager(config, rank, dcp_rank, block_tables))
                for rank in range(config.pcp_size) for dcp_rank in range(1, config.dcp_size)]

    def _pcp_manager(self, config: RunnerConfig, pcp_rank: int, dcp_rank: int,
                     block_tables: Any = None) -> Any:
        """One rank's PCPManager; built with the runner's block tables, as
        initialize_kv_cache builds it (0.30-0.32; 0.33 also sets them later),
        its options read off the trace config's VllmConfig as vLLM's builder
        reads them (versions.pcp_kwargs)."""
        return self.PCPManager(
            pcp_world_size=config.pcp_size,
            pcp_rank=pcp_rank,
            device=self.device,
            max_num_reqs=config.max_num_reqs,
            max_num_tokens=config.max_num_batched_tokens,
            dcp_world_size=config.dcp_size,
            dcp_rank=dcp_rank,
            **versions.pcp_kwargs(self.shape, config.shard_decode_requests, self.PCPManager,
                                  vllm_config_for(config).parallel_config),
            **({"block_tables": block_tables} if block_tables is not None else {}),
        )

    def partition_for_rank(self, manager: Any, input_batch: Any, batch_desc: Any) -> Any:
        """A PCP rank past 0 partitions the global batch as the release does."""
        return versions.partition_for_rank(self.shape, manager, input_batch, batch_desc)

    def unavailable(self, config: RunnerConfig) -> list[versions.Unavailable]:
        """Stages this release cannot drive for ``config`` (the rest still run)."""
        return self.shape.unavailable(pcp_size=config.pcp_size,
                                      shard_decode_requests=config.shard_decode_requests)

    def dummy_buffers(self, config: RunnerConfig) -> Any:
        return self.InputBuffers(
            max_num_reqs=config.max_num_reqs,
            max_num_tokens=config.max_num_batched_tokens,
            device=self.device,
        )


_api: VllmApi | None = None


def load() -> VllmApi:
    """The adapter for the installed vLLM (built once per process)."""
    global _api
    if _api is None:
        _api = VllmApi()
    return _api


def entry_point_report() -> tuple[str, list[EntryPointStatus]]:
    """(version, status per entry point) without stopping at the first drift."""
    _import_vllm()
    version = _vllm_version()
    statuses = []
    for ep in ENTRY_POINTS:
        try:
            _resolve(ep, version)
            statuses.append(EntryPointStatus(ep, True))
        except VllmApiError as exc:
            statuses.append(EntryPointStatus(ep, False, str(exc)))
    return version, statuses


# ------------------------------------------------------- release differences
# Everything that differs between vLLM releases is decided in versions.py;
# these two functions only hand it the installed objects.
def _detect_shape(version: str, resolved: dict[str, Any], runner_cls: Any) -> versions.ApiShape:
    return versions.detect_shape(
        version, runner_cls=runner_cls, pcp_cls=resolved["PCPManager"],
        request_state_cls=resolved["RequestState"],
        scheduler_output_cls=resolved["SchedulerOutput"],
        new_request_cls=resolved["NewRequestData"],
        cached_request_cls=resolved["CachedRequestData"],
        block_tables_cls=importlib.import_module("vllm.v1.worker.gpu.block_table").BlockTables)


def shape_report() -> versions.ApiShape:
    """The installed release's call shape (VllmApiError on a shape simrig does not know)."""
    return load().shape
