"""Every patch to Triton's interpreter goes in through here, checked and recorded.

A patch declares its target, a probe (a small computation whose answer is plain data) and
the Triton versions it is known good on. ``apply`` installs it only when the probe agrees
before and after (the decision is drawn in its docstring), so a patch is never left half
applied, and ``patch_states`` says per patch what happened and why (``simrig doctor`` and
every report's summary show it). See docs/setup.md, "Triton's interpreter patches".
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simrig.triton_interpreter.interpreter_types import plain_new

SPEEDUPS_ENV = "SIMRIG_INTERPRETER_SPEEDUPS"  # "0": no speed patch (Triton's own plumbing, to compare)
PATCHES_ENV = "SIMRIG_INTERPRETER_PATCHES"  # "force": install on a Triton no patch is known good on
INSTALLED, SKIPPED, FAILED = "installed", "skipped", "failed"


@dataclass(frozen=True)
class Patch:
    name: str
    module: str  # the module the target attributes are reached from
    attrs: tuple[str, ...]  # dotted paths under ``module``: what ``install`` replaces
    install: Callable[[], bool]  # True when installed (False: its own layout check refused)
    probe: Callable[[], Any]  # plain data, compared with ``==`` before and after ``install``
    known_good: tuple[str, ...]  # Triton versions the patch was verified on
    required: str = ""  # why SIMRIG_INTERPRETER_SPEEDUPS=0 leaves it on ("" : a speed patch)
    needs: tuple[str, ...] = ()  # patches that must be installed first
    undo: Callable[[], None] | None = None  # what putting the attributes back does not undo

    @property
    def target(self) -> str:
        return f"{self.module}: {', '.join(self.attrs)}"


@dataclass(frozen=True)
class PatchState:
    name: str
    state: str  # INSTALLED, SKIPPED or FAILED
    reason: str  # why (empty when installed)
    target: str = ""

    def line(self) -> str:
        return f"{self.state:<9} {self.name}" + (f": {self.reason}" if self.reason else "")


_states: dict[str, PatchState] = {}
_installed: list[tuple[Patch, list[tuple[Any, str, Any, bool]]]] = []  # in install order, with what each replaced
_answers: dict[Callable[[], Any], Any] = {}  # probe -> its answer before the first patch it checked


def triton_version() -> str:
    """The installed Triton's version ("" without Triton); tests replace it to simulate a
    Triton the patches do not know."""
    try:
        import triton  # optional: triton
    except ImportError:
        return ""
    return str(getattr(triton, "__version__", ""))


def patch_states() -> list[PatchState]:
    """Each patch ``apply`` saw in this process, in install order, with its state."""
    return list(_states.values())


def summary() -> dict[str, Any]:
    """The states for a report's summary: counts, one line, and each patch."""
    states = patch_states()
    triton = sys.modules.get("triton")  # never imported here only to be named
    counts = {s: sum(p.state == s for p in states) for s in (INSTALLED, SKIPPED, FAILED)}
    line = (", ".join(f"{n} {s}" for s, n in counts.items()) if states
            else "none in this process (CUDA mode, or the kernels ran in other processes)")
    return {**counts, "line": line, "triton": str(getattr(triton, "__version__", "")),
            "patches": [{"name": p.name, "state": p.state, "reason": p.reason} for p in states]}


def forced() -> bool:
    return os.environ.get(PATCHES_ENV, "").strip().lower() == "force"


def speedups_on() -> bool:
    return os.environ.get(SPEEDUPS_ENV, "1") != "0"


def _owner(patch: Patch, path: str) -> tuple[Any, str]:
    obj: Any = importlib.import_module(patch.module)
    *parents, name = path.split(".")
    for part in parents:
        obj = getattr(obj, part)
    return obj, name


def _snapshot(patch: Patch) -> list[tuple[Any, str, Any, bool]] | str:
    """(owner, name, value, own) per target attribute, or the first one missing."""
    saved = []
    for path in patch.attrs:
        try:
            owner, name = _owner(patch, path)
            value = getattr(owner, name)
        except (ImportError, AttributeError):
            return f"{patch.module}.{path}"
        saved.append((owner, name, value, name in vars(owner)))
    return saved


def _put_back(patch: Patch, saved: list[tuple[Any, str, Any, bool]], undo: bool = True) -> None:
    """Every target attribute as it was before ``install`` (an inherited one shows through
    again); the patch's own ``undo`` first, unless its install refused (nothing to undo)."""
    if undo and patch.undo is not None:
        patch.undo()
    for owner, name, value, own in reversed(saved):
        if own:
            if vars(owner).get(name, _MISSING) is not value:
                setattr(owner, name, value)
        elif name in vars(owner):
            if name == "__new__":  # a class's __new__ cannot be deleted again once assigned
                setattr(owner, name, plain_new)
            else:
                delattr(owner, name)


_MISSING = object()


def _record(patch: Patch, state: str, reason: str = "") -> PatchState:
    _states[patch.name] = PatchState(patch.name, state, reason, patch.target)
    return _states[patch.name]


def apply(patch: Patch, force: bool | None = None) -> PatchState:
    """Install one patch if it may and its probe agrees; record its state. A patch already
    installed, or failed, in this process keeps its state (a skipped one is looked at
    again: the environment may have changed).

        SIMRIG_INTERPRETER_SPEEDUPS=0, not required ─► skipped (Triton's own plumbing)
        Triton not in its known-good list           ─► skipped, unless SIMRIG_INTERPRETER_PATCHES=force
        a patch it needs is not installed           ─► skipped
        a target attribute missing                  ─► failed
        probe() with Triton's answer as it stands ──┐
        install(); probe() again ───────────────────┴► equal: installed
                                                       refused, raised, or differs: failed,
                                                       every target attribute put back
    """
    known = _states.get(patch.name)
    if known is not None and known.state in (INSTALLED, FAILED):
        return known
    if not patch.required and not speedups_on():
        return _record(patch, SKIPPED, f"{SPEEDUPS_ENV}=0 (Triton's own plumbing)")
    version = triton_version()
    if version not in patch.known_good and not (forced() if force is None else force):
        return _record(patch, SKIPPED, f"Triton {version or '(none)'} is not one it is known good on "
                                       f"({', '.join(patch.known_good)}); {PATCHES_ENV}=force installs it")
    for need in patch.needs:
        state = _states.get(need)
        if state is None or state.state != INSTALLED:
            return _record(patch, SKIPPED, f"needs {need}, which is {state.state if state else 'not applied'}")
    saved = _snapshot(patch)
    if isinstance(saved, str):
        return _record(patch, FAILED, f"target missing: {saved}")
    try:
        # the answer from the probe's first run in this process, before any patch that uses it:
        # each later patch is held to that one, and the kernel probes run once less each
        before = _answers[patch.probe] if patch.probe in _answers else patch.probe()
    except Exception as exc:
        return _record(patch, FAILED, f"probe fails on Triton's own code: {type(exc).__name__}: {exc}")
    _answers.setdefault(patch.probe, before)
    try:
        if not patch.install():
            _put_back(patch, saved, undo=False)
            return _record(patch, FAILED, "its layout check refused this Triton")
        after = patch.probe()
    except Exception as exc:
        _put_back(patch, saved)
        return _record(patch, FAILED, f"probe raised with the patch: {type(exc).__name__}: {exc}")
    if after != before:
        _put_back(patch, saved)
        return _record(patch, FAILED, f"probe disagreed with Triton's own answer: {_first_difference(before, after)}")
    _installed.append((patch, saved))
    return _record(patch, INSTALLED)


def _first_difference(a: Any, b: Any, at: str = "") -> str:
    """Where two probe answers first differ, briefly."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{at}[{i}]")
    return f"{at or 'answer'}: {str(a)[:80]} != {str(b)[:80]}"


def take_back_all(reason: str) -> None:
    """Put back every installed patch, last first; each is recorded failed with ``reason``."""
    while _installed:
        patch, saved = _installed.pop()
        _put_back(patch, saved)
        _record(patch, FAILED, reason)


def install_all(patches: Sequence[Patch], startup_check: Callable[[], Any] | None = None,
                check_name: str = "start-up check") -> list[PatchState]:
    """``apply`` each patch in order. On a Triton some patch is not known good on, with
    SIMRIG_INTERPRETER_PATCHES=force, ``startup_check`` (a real kernel's output, plain data)
    runs before and after; if they differ, every patch is taken back and says why."""
    unknown = forced() and any(triton_version() not in p.known_good for p in patches)
    before = None
    if unknown and startup_check is not None and any(p.name not in _states for p in patches):
        before = startup_check()
    for patch in patches:
        apply(patch)
    if before is not None and _installed:
        after = startup_check()
        if after != before:
            take_back_all(f"{check_name} on Triton {triton_version()}: output differs with the patches "
                          f"({_first_difference(before, after)})")
    return patch_states()


def forget() -> None:
    """Put back every patch and forget every state (tests: a fresh start in this process)."""
    take_back_all("")
    _states.clear()
    _answers.clear()
