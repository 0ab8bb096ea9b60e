"""Run a vLLM commit without building it: its MRV2 sources laid over an installed release.

``python -m simrig.vllm_runtime.overlay COMMAND ...`` installs ``OverlayFinder`` before
vLLM is imported when ``SIMRIG_OVERLAY`` names a folder of a commit's files: inside the
overlaid paths (``SIMRIG_OVERLAY_PATHS``) the folder is authoritative, everything else
is the installed release's. ``SIMRIG_OVERLAY_LOG`` records each module served from the
folder. ``simrig bisect`` starts its commit points this way.

See docs/bisect.md, 'The overlay: a commit without a build'.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

ENV_ROOT = "SIMRIG_OVERLAY"
ENV_PATHS = "SIMRIG_OVERLAY_PATHS"
ENV_LOG = "SIMRIG_OVERLAY_LOG"
DEFAULT_PATHS = ("vllm/v1/worker/gpu",)


def parse_paths(text: str | None) -> tuple[str, ...]:
    """'vllm/v1/worker/gpu, vllm/v1/core/sched/output.py' -> normalised relative paths."""
    if not text or not text.strip():
        return DEFAULT_PATHS
    out = []
    for part in text.split(","):
        part = part.strip().strip("/")
        if not part:
            continue
        if part.startswith("..") or "/../" in f"/{part}/" or os.path.isabs(part):
            raise ValueError(f"overlay path {part!r}: must be relative, inside the package root")
        out.append(part)
    return tuple(out) or DEFAULT_PATHS


def module_prefix(path: str) -> str:
    """'vllm/v1/worker/gpu' -> 'vllm.v1.worker.gpu'; 'a/b.py' -> 'a.b'."""
    return path.removesuffix(".py").replace("/", ".")


class OverlayFinder(importlib.abc.MetaPathFinder):
    """Serves every module under the overlaid paths from ``root``."""

    def __init__(self, root: str | Path, paths: Sequence[str] = DEFAULT_PATHS,
                 log: str | None = None):
        self.root = Path(root)
        self.prefixes = tuple(module_prefix(p) for p in paths)
        self.log = log
        self.served: list[str] = []

    def covers(self, fullname: str) -> bool:
        return any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes)

    def find_spec(self, fullname, path=None, target=None):
        if not self.covers(fullname):
            return None
        rel = self.root.joinpath(*fullname.split("."))
        init = rel / "__init__.py"
        if init.is_file():
            spec = importlib.util.spec_from_file_location(
                fullname, init, submodule_search_locations=[str(rel)])
        elif rel.with_name(rel.name + ".py").is_file():
            spec = importlib.util.spec_from_file_location(fullname, rel.with_name(rel.name + ".py"))
        else:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} in the overlaid commit ({self.root})", name=fullname)
        self.served.append(fullname)
        if self.log:
            with open(self.log, "a", encoding="utf-8") as fh:
                fh.write(f"{fullname}\t{spec.origin}\n")
        return spec


_installed: OverlayFinder | None = None


def install(root: str | Path, paths: Sequence[str] = DEFAULT_PATHS,
            log: str | None = None) -> OverlayFinder:
    """Put the finder first on sys.meta_path; refuses when vLLM's overlaid modules
    were already imported from elsewhere (they would silently stay the release's)."""
    global _installed
    finder = OverlayFinder(root, paths, log)
    early = [m for m in sys.modules if finder.covers(m)]
    if early:
        raise RuntimeError(f"simrig overlay: {early[0]} was imported before the overlay was installed")
    if _installed is not None and _installed in sys.meta_path:
        sys.meta_path.remove(_installed)
    sys.meta_path.insert(0, finder)
    _installed = finder
    return finder


def install_from_env() -> OverlayFinder | None:
    """Install the finder ``SIMRIG_OVERLAY`` / ``SIMRIG_OVERLAY_PATHS`` describe (None: unset)."""
    root = os.environ.get(ENV_ROOT)
    if not root:
        return None
    if not Path(root).is_dir():
        raise RuntimeError(f"simrig overlay: {ENV_ROOT}={root} is not a folder")
    return install(root, parse_paths(os.environ.get(ENV_PATHS)), os.environ.get(ENV_LOG) or None)


def main(argv: list[str] | None = None) -> None:
    """``python -m simrig.vllm_runtime.overlay [-m MODULE] ARGS``: install the overlay,
    then run MODULE (default: the simrig CLI) as ``python -m`` would."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        install_from_env()
    except (RuntimeError, ValueError) as exc:
        print(f"simrig overlay: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    module = "simrig"
    if args[:1] == ["-m"]:
        if len(args) < 2:
            print("simrig overlay: error: -m needs a module name", file=sys.stderr)
            raise SystemExit(2)
        module, args = args[1], args[2:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
