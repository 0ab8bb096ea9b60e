"""``simrig doctor``: is the installed vLLM usable by simrig here?"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check the installed vLLM, torch, triton and device",
                       description="Print versions, the device mode and one line per vLLM "
                                   "entry point simrig drives. Exit 0 when all are usable, 2 otherwise.")
    p.set_defaults(func=run)


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def run(args: argparse.Namespace) -> int:
    # cold path: the adapters and the platform probe vLLM and torch, off `simrig --help`
    from simrig.adapters.runner import entry_point_report
    from simrig.vllm_runtime import platform  # cold path (see above)

    choice = platform.configure()
    print(f"simrig   {_version('simrig')}")
    print(f"torch    {_version('torch')}")
    print(f"triton   {_version('triton')}")
    print(f"device   {choice.device} ({choice.mode})")
    vllm_version, statuses = entry_point_report()  # VllmUnavailable -> one line, exit 2
    print(f"vllm     {vllm_version}")
    for status in statuses:
        ep = status.entry_point
        mark = "ok  " if status.ok else "FAIL"
        print(f"  {mark} {ep.module}.{ep.attribute}" + ("" if status.ok else f": {status.problem}"))
    bad = [s for s in statuses if not s.ok]
    if bad:
        print(f"simrig doctor: error: {bad[0].problem}", file=sys.stderr)
        return 2
    if choice.is_cpu and _version("triton") == "not installed":
        print("simrig doctor: error: CPU mode needs triton for the Triton interpreter", file=sys.stderr)
        return 2
    _print_release_shape()
    _print_interpreter_patches(choice.is_cpu)
    print("all entry points usable")
    return 0


def _print_interpreter_patches(cpu: bool) -> None:
    """Each interpreter patch and its state (never fatal: a patch not installed
    leaves Triton's own code running)."""
    from simrig.triton_interpreter import registry  # cold path: Triton's version, off `simrig --help`

    if not cpu:
        print("interpreter patches: none (CUDA mode: Triton compiles the kernels)")
        return
    print(f"interpreter patches (Triton {registry.triton_version()}): {registry.summary()['line']}")
    for state in registry.patch_states():
        print(f"  {state.line()}")


def _print_release_shape() -> None:
    """How simrig calls this release, and what it cannot drive here (never fatal)."""
    from simrig.adapters.runner import shape_report  # cold path: vLLM, off `simrig --help`

    shape = shape_report()  # a shape the adapter does not know -> VllmApiError, exit 2
    print("call shape (read from the installed code):")
    for line in shape.describe():
        print(f"  {line}")
    missing = shape.unavailable(pcp_size=2, shard_decode_requests=True)
    for name, ok in shape.capabilities().items():
        print(f"  {'ok  ' if ok else 'n/a '} capability {name}")
    for item in missing:
        print(f"unavailable on this vLLM: {item.line()}; the other stages run")
