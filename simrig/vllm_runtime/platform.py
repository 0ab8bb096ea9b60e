"""Device choice, applied before vLLM is imported.

    torch.cuda.is_available()?
        yes -> mode "cuda": vLLM's own platform, kernels compiled by Triton
        no  -> mode "cpu-interpreter": VLLM_TARGET_DEVICE=cpu, no visible CUDA
               devices, TRITON_INTERPRET=1 (MRV2 kernels run in Triton's
               interpreter), and UVA reported unavailable (pinned memory
               needs CUDA)

This is the only module that adjusts vLLM's platform plumbing. It never
touches the boundary logic under test: the UVA switch only picks vLLM's own
explicit-copy buffer class instead of the pinned-memory one.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from simrig.vllm_runtime import interpreter_patches

CPU_MODE = "cpu-interpreter"
CUDA_MODE = "cuda"


@dataclass(frozen=True)
class PlatformChoice:
    mode: str  # CPU_MODE or CUDA_MODE
    device: str  # torch device string

    @property
    def is_cpu(self) -> bool:
        return self.mode == CPU_MODE


_choice: PlatformChoice | None = None


def current() -> PlatformChoice | None:
    """The platform chosen by ``configure`` (None before it ran)."""
    return _choice


def _default_cache_root() -> str:
    return str(Path(os.environ.get("SIMRIG_CACHE", Path.cwd() / ".cache")) / "vllm")


def configure(force_cpu: bool | None = None) -> PlatformChoice:
    """Pick the device and set the environment vLLM reads at import time.

    Idempotent. ``force_cpu`` (or SIMRIG_DEVICE=cpu) keeps CPU mode on a CUDA
    machine; raises RuntimeError if vLLM was already imported under another
    choice, because vLLM fixes its platform at import.
    """
    global _choice
    if force_cpu is None:
        force_cpu = os.environ.get("SIMRIG_DEVICE", "").lower() == "cpu"
    if _choice is not None:
        if force_cpu and not _choice.is_cpu:
            raise RuntimeError("simrig: platform already configured for CUDA")
        return _choice

    import torch  # lazy: torch loads only when this runs

    use_cuda = torch.cuda.is_available() and not force_cpu
    os.environ.setdefault("VLLM_CACHE_ROOT", _default_cache_root())
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    # The input path logs at debug level on every step; keep runs readable.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if use_cuda:
        _choice = PlatformChoice(CUDA_MODE, "cuda")
        return _choice

    if "vllm.platforms" in sys.modules and os.environ.get("VLLM_TARGET_DEVICE") != "cpu":
        raise RuntimeError(
            "simrig: vllm was imported before simrig.vllm_runtime.platform.configure(); "
            "import simrig first so the CPU platform can be selected"
        )
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["TRITON_INTERPRET"] = "1"
    _choice = PlatformChoice(CPU_MODE, "cpu")
    return _choice


def libdevice_runs(names: set[str] | frozenset[str]) -> bool:
    """Whether kernels calling these libdevice functions run in this process: on a GPU, always;
    in Triton's CPU interpreter, where ``answer_libdevice`` gives each its meaning."""
    if _choice is not None and not _choice.is_cpu:
        return True
    from simrig.triton_libdevice import libdevice  # lazy: numpy, only when asked

    return set(names) <= libdevice.answered()


def apply_after_import() -> None:
    """Post-import plumbing: in CPU mode, report UVA as unavailable and install
    the interpreter patches (``interpreter_patches``)."""
    if _choice is None or not _choice.is_cpu:
        return
    from vllm.v1.worker.gpu import buffer_utils  # lazy: vllm loads after platform.configure() sets its env

    buffer_utils.is_uva_available = lambda: False

    # every patch through the registry: probed against Triton's own answer,
    # skipped on a Triton it is not known good on, its state recorded
    interpreter_patches.install()


@contextlib.contextmanager
def patched(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each ``(owner, name, value)``: ``owner.name = value`` for the length of the
    block, restored in reverse order after it; a name the owner lacks (an
    older or newer release) is left alone."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, value in patches:
            if hasattr(owner, name):
                saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


@contextlib.contextmanager
def graph_capture_without_cuda() -> Iterator[None]:
    """CUDA graph capture's device plumbing as no-ops, for the length of one
    capture: the graph and its pool, the capture stream, the TP group's
    capture context, the accelerator's memory queries and the gc freeze.

    What capture decides (which descriptors, the dummy batch each is captured
    with, its block tables and slot mappings, the forward it records) is
    vLLM's own code and runs unchanged; a "captured" graph replays nothing, so
    a FULL replay returns the hidden states stored at capture, as on a GPU.
    """
    # lazy: vllm and torch load after platform.configure() sets the env
    import torch
    from vllm.v1.worker.gpu import cudagraph_utils

    class _Graph:  # torch.cuda.CUDAGraph
        def replay(self) -> None:
            pass

    nothing = contextlib.nullcontext
    from vllm.v1.worker import workspace  # lazy: vllm loads after platform.configure() sets its env

    if not workspace.is_workspace_manager_initialized():  # the worker makes it at startup
        workspace.init_workspace_manager(torch.device(_choice.device if _choice else "cpu"))
    from vllm.v1.worker.gpu import model_runner  # lazy: vllm loads after platform.configure() sets its env

    patches = [
        # a full gc.collect() twice per capture: it keeps graph memory from being
        # collected on a GPU, and costs half a second per runner here
        (model_runner, "freeze_gc_for_cudagraph_capture", lambda *a, **kw: nothing()),
        (cudagraph_utils, "graph_capture", lambda device=None: nothing()),
        (cudagraph_utils, "capture_pool", lambda pool, vllm_config: nothing(pool)),
        # 0.30-0.31 name the pool for NCCL: set_graph_pool_id(platform.graph_pool_handle())
        (cudagraph_utils, "set_graph_pool_id", lambda pool: None),
        (cudagraph_utils.current_platform, "graph_pool_handle", lambda: None),
        (cudagraph_utils, "current_stream", lambda: None),
        (cudagraph_utils, "is_global_first_rank", lambda: False),  # no progress bar
        (torch.cuda, "CUDAGraph", _Graph),
        (torch.cuda, "graph", lambda graph, pool=None, stream=None, **kw: nothing())]
    if hasattr(torch, "accelerator"):
        patches += [(torch.accelerator, "empty_cache", lambda: None),
                    (torch.accelerator, "synchronize", lambda *a: None),
                    (torch.accelerator, "get_memory_info", lambda *a: (0, 0))]
    with patched(patches):
        yield


@contextlib.contextmanager
def graph_manager_without_process_groups() -> Iterator[None]:
    """``CudaGraphManager.__init__``'s two lookups outside the config, for the
    length of one construction: the pipeline-parallel group (simrig runs one
    stage, first and last; no process group exists) and the platform's graph
    pool (no graph is ever captured into it: see graph_capture_without_cuda).
    Everything the manager decides from its VllmConfig runs unchanged."""
    from vllm.v1.worker.gpu import cudagraph_utils  # lazy: vllm loads after platform.configure() sets its env

    one_stage = SimpleNamespace(is_first_rank=True, is_last_rank=True)
    with patched([(cudagraph_utils, "get_pp_group", lambda: one_stage),
                   (cudagraph_utils.current_platform, "get_global_graph_pool", lambda: None)]):
        yield


def unlock_workspace() -> None:
    """After a capture: vLLM locks its workspace once the worker's graphs are
    captured; each simrig runner in this process captures its own, so the next
    one must be able to size it again."""
    from vllm.v1.worker import workspace  # lazy: vllm loads after platform.configure() sets its env

    if workspace.is_workspace_manager_initialized():
        workspace.unlock_workspace()


class StreamStandIn:
    """A CUDA stream on a machine without one: CPU work is already ordered."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else EventStandIn()


class EventStandIn:
    """A CUDA event on a machine without one: every copy it guards is done."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


@contextlib.contextmanager
def streams_without_cuda() -> Iterator[None]:
    """CUDA streams and events as no-ops, for the length of one call (the
    sampling step's async output copy, the draft-token handler): on CPU every
    copy completes before the next statement, so the ordering they enforce
    holds already. Nothing changes on a CUDA machine."""
    if _choice is None or not _choice.is_cpu:
        yield
        return
    import torch  # lazy: torch loads only when this runs

    with patched([(torch.cuda, "Event", EventStandIn),
                   (torch.cuda, "Stream", lambda *args, **kwargs: StreamStandIn()),
                   (torch.cuda, "set_stream", lambda stream: None),
                   (torch.cuda, "current_stream", lambda device=None: StreamStandIn()),
                   (torch.cuda, "stream", lambda stream: contextlib.nullcontext())]):
        yield


class OneProcessGroup:
    """A process group of ``world_size`` ranks run in this one process: an
    all-gather stacks each rank's share. The rig runs only PCP rank 0's forward:
    the stand-in model's hidden states carry every rank's share (``rank_shares``,
    each named from that rank's local batch); any other tensor is stacked once per rank."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def all_gather(self, tensor: Any, dim: int = 0) -> Any:
        import torch  # lazy: torch loads only when this runs

        shares = getattr(tensor, "rank_shares", None)
        return torch.cat(shares() if shares is not None else [tensor] * self.world_size, dim=dim)


@contextlib.contextmanager
def pcp_group(world_size: int) -> Iterator[None]:
    """vLLM's PCP process group as a ``OneProcessGroup`` for one call
    (sampling restores the PCP-sharded hidden states with an all-gather)."""
    from vllm.distributed import parallel_state  # lazy: vllm loads after platform.configure() sets its env

    with patched([(parallel_state, "_PCP", OneProcessGroup(world_size))]):
        yield


@contextlib.contextmanager
def dp_group(world_size: int) -> Iterator[None]:
    """vLLM's DP process group as a ``OneProcessGroup`` for one call: 0.30.0-0.32.0's
    ``sync_cudagraph_and_dp_padding`` looks the group's ``cpu_group`` up before it
    asks ``should_skip_dp_coordination()``; under vLLM's skip every rank's row is this
    rank's and the handle is never used."""
    from vllm.distributed import parallel_state  # lazy: vllm loads after platform.configure() sets its env

    group = OneProcessGroup(world_size)
    group.cpu_group = None  # type: ignore[attr-defined]
    with patched([(parallel_state, "_DP", group)]):
        yield


@contextlib.contextmanager
def profile_without_cuda() -> Iterator[None]:
    """For the length of ``profile_run``: the accelerator sync as a no-op on
    CPU (nothing is queued), and no full ``gc.collect()`` (it frees the
    profile's memory on a GPU and costs a tenth of a second per runner here)."""
    import torch  # lazy: torch loads only when this runs

    patches: list[tuple[Any, str, Any]] = [(gc, "collect", lambda *args: 0)]
    if _choice is not None and _choice.is_cpu and hasattr(torch, "accelerator"):
        patches.append((torch.accelerator, "synchronize", lambda *args: None))
    with patched(patches):
        yield
