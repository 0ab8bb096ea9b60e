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

import os
import sys
from dataclasses import dataclass
from pathlib import Path

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

    import torch

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
            "simrig: vllm was imported before simrig.adapters.platform.configure(); "
            "import simrig first so the CPU platform can be selected"
        )
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["TRITON_INTERPRET"] = "1"
    _choice = PlatformChoice(CPU_MODE, "cpu")
    return _choice


def apply_after_import() -> None:
    """Post-import plumbing: in CPU mode, report UVA as unavailable."""
    if _choice is None or not _choice.is_cpu:
        return
    from vllm.v1.worker.gpu import buffer_utils

    buffer_utils.is_uva_available = lambda: False

