"""The interpreter patches installed in CPU mode, through their registry.

``install`` hands ``triton_interpreter.registry`` the catalogue's patches,
memcheck last when ``SIMRIG_MEMCHECK=1`` asked for it (it wraps the launch as
the others left it; ``memcheck_ran`` says whether it went in), and, for a
Triton the patches are not known good on (installed only with
``SIMRIG_INTERPRETER_PATCHES=force``), a start-up check: one of vLLM's own
MRV2 kernels, the slot-mapping kernel behind ``BlockTables.compute_slot_mappings``,
run before and after the patches; if its output bytes differ, every patch is
taken back and its state says why.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from simrig.triton_interpreter import patch_catalogue, registry

MEMCHECK_ENV = "SIMRIG_MEMCHECK"
CHECK_KERNEL = "_compute_slot_mappings_kernel"


def memcheck_patch() -> registry.Patch:
    """``--memcheck`` as a registry entry: a checker asked for, not a speed-up."""
    from simrig.triton_memcheck import memcheck  # lazy: triton_memcheck brings numpy, needed only here

    builder = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas",
               "create_int_to_ptr", "options")
    return registry.Patch(
        "memcheck", patch_catalogue.INTERP,
        (*(f"interpreter_builder.{n}" for n in builder), "interpreter_semantic.binary_op_sanitize_overflow_impl",
         "GridExecutor.__call__"),
        memcheck.install, patch_catalogue.kernel_bytes, patch_catalogue.KNOWN_GOOD,
        required=f"a checker the run asked for ({MEMCHECK_ENV}=1), not a speed-up",
        undo=memcheck.uninstall)


def libdevice_patch() -> registry.Patch:
    """libdevice's ``log1p`` and ``isnan`` answered in the interpreter: required, not a speed-up."""
    from simrig.triton_libdevice import libdevice  # lazy: only CPU mode installs it

    return registry.Patch(
        "answer_libdevice", libdevice.LIBDEVICE_MODULE, tuple(libdevice.LIBDEVICE_MEANINGS),
        libdevice.answer_libdevice, libdevice.probe, patch_catalogue.KNOWN_GOOD,
        required="not a speed-up: vLLM's Gumbel kernel (0.30.0) and rejection sampler call libdevice's log1p")


def patches() -> list[registry.Patch]:
    """What CPU mode installs, in order."""
    found = [*patch_catalogue.PATCHES, libdevice_patch()]
    if os.environ.get(MEMCHECK_ENV) == "1":
        found.append(memcheck_patch())
    return found


def memcheck_ran() -> bool:
    """Whether memcheck checks this process's kernels: its registry entry installed, not merely
    asked for (False in CUDA mode, where compute-sanitizer is the checker, and where the entry
    was skipped, failed or taken back); what a report's ``memcheck`` says."""
    return any(s.name == "memcheck" and s.state == registry.INSTALLED for s in registry.patch_states())


def slot_mapping_bytes() -> list:
    """vLLM's ``BlockTables.compute_slot_mappings`` (its Triton kernel) on a
    small batch of two KV-cache groups: the slot mappings it writes, as plain data."""
    # lazy: vllm and torch load after platform.configure() sets the env
    import torch
    from vllm.v1.worker.gpu.block_table import BlockTables

    device = torch.device("cpu")
    wanted: dict[str, Any] = {"block_sizes": [16, 32], "max_num_reqs": 4, "max_num_batched_tokens": 64,
                              "max_num_blocks_per_group": [8, 8], "device": device,
                              "kernel_block_sizes": [16, 32]}  # 0.30-0.31 take it
    params = inspect.signature(BlockTables.__init__).parameters
    tables = BlockTables(**{k: v for k, v in wanted.items() if k in params})
    for group, table in enumerate(tables.block_tables):  # each request's blocks, written in place
        table.gpu.copy_(torch.arange(table.gpu.numel(), dtype=torch.int32).reshape(table.gpu.shape) * (group + 3))
    idx_mapping = torch.tensor([2, 0, 3], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 5, 6, 30], dtype=torch.int32)
    positions = torch.cat([torch.arange(40, 45), torch.arange(7, 8), torch.arange(100, 124)]).to(torch.int64)
    out = tables.compute_slot_mappings(idx_mapping, query_start_loc, positions, 40)
    return [str(out.dtype), out.tolist()]


def install() -> list[registry.PatchState]:
    """Every interpreter patch through the registry; the states it recorded."""
    return registry.install_all(patches(), startup_check=slot_mapping_bytes,
                                check_name=f"start-up check ({CHECK_KERNEL})")
