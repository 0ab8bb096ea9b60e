"""``simrig env``: side venvs holding another vLLM (see simrig/releases/envs.py)."""

from __future__ import annotations

import argparse
import sys

from simrig.errors import UsageError


DESCRIPTION = """Side venvs under .venvs/ hold another vLLM (a release, a wheel or a source
    checkout) with the bootstrap's CPU recipe, for simrig compare."""
EPILOG = """exit status: 0 the side venv was built (create) or listed (list); 2 an unknown
    --vllm spec, a release without Model Runner V2, or a failed install (one line on
    stderr)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", description=DESCRIPTION, epilog=EPILOG,
                       help="build and list side venvs for other vLLM releases")
    env_sub = p.add_subparsers(dest="env_command", metavar="ACTION")
    env_sub.required = True
    create = env_sub.add_parser("create", help="build the side venv for --vllm SPEC")
    create.add_argument("--vllm", required=True, metavar="SPEC",
                        help="a release (0.31.0), a vLLM wheel or a vLLM source checkout")
    create.add_argument("--layered", action="store_true",
                        help="install only vLLM (and xgrammar) and take torch, the pinned CPU set "
                             "and simrig from this project's venv: seconds instead of minutes, "
                             "but the side venv breaks if the project venv changes (CI, quick checks)")
    create.set_defaults(func=run_create)
    listing = env_sub.add_parser("list", help="the side venvs and their doctor verdict")
    listing.set_defaults(func=run_list)


def run_create(args: argparse.Namespace) -> int:
    from simrig.releases import envs  # cold path: only this command needs the side venvs

    side = envs.resolve_spec(args.vllm)
    venv = envs.create(side, layered=args.layered, log=lambda line: print(line, file=sys.stderr))
    verdict = envs.doctor(side, cache_bytecode=True)
    if not verdict.ok:
        raise UsageError(f"--vllm {args.vllm}: built {venv}, but its vLLM is unusable: {verdict.line}")
    print(f"{venv}  vLLM {verdict.version}  doctor ok"
          + "".join(f"\n  unavailable: {u}" for u in verdict.unavailable))
    return 0


def run_list(args: argparse.Namespace) -> int:
    from simrig.releases import envs  # cold path: only this command needs the side venvs

    sides = envs.list_sides()
    if not sides:
        print(f"no side venvs under {envs.VENVS} (simrig env create --vllm X.Y.Z)")
        return 0
    for side, verdict in sides:
        status = "doctor ok" if verdict.ok else f"doctor FAIL: {verdict.line}"
        print(f"{side.venv}  vLLM {verdict.version}  {status}")
        for item in verdict.unavailable:
            print(f"  unavailable: {item}")
    return 0
