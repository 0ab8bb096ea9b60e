"""The mutation engine: seeded regressions of the installed vLLM, in memory.

A mutant names one function of the installed vLLM and a text edit of its
source. Applying it re-executes the edited function in its own module's
namespace and rebinds every reference to the original (the class attribute,
the module global, and any ``from ... import name`` copies in other vLLM
modules). The installed files are never modified and nothing of vLLM is
copied into the repository: the source is read from the install at run time.

    inspect.getsource(fn) --edit--> compile --exec in fn.__globals__--> rebind

Mutants are applied in a child process (see simrig.selftest.mutant_runs), so one
mutant never leaks into another run.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Any


class MutantError(RuntimeError):
    """A mutant does not apply to the installed vLLM (its source changed)."""


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # e.g. "vllm.v1.worker.gpu.model_runner"
    qualname: str  # "Class.method" or "function"
    old: str  # exact source text to replace (must occur exactly once)
    new: str
    description: str  # the real-world bug this mutant stands for
    # An equivalent mutant changes no observable behaviour at the boundary;
    # it is listed to document what simrig cannot see, and never counts as a
    # survivor. The README argues each one.
    equivalent: bool = False
    # A control mutant edits the source without changing its behaviour at
    # all: it must come out SURVIVED, or the scoring itself is broken
    # (a detection that comes from the rig, not from the mutant).
    control: bool = False


def _owner_and_function(mutant: Mutant) -> tuple[Any, str, Any]:
    try:
        module = importlib.import_module(mutant.module)
    except ImportError as exc:
        raise MutantError(f"{mutant.name}: module {mutant.module} not importable ({exc})") from None
    owner: Any = module
    parts = mutant.qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            raise MutantError(f"{mutant.name}: {mutant.module}.{mutant.qualname} not found")
    fn = owner.__dict__.get(parts[-1]) if isinstance(owner, type) else getattr(owner, parts[-1], None)
    if fn is None:
        raise MutantError(f"{mutant.name}: {mutant.module}.{mutant.qualname} not found")
    return owner, parts[-1], fn


def mutated_source(mutant: Mutant) -> str:
    """The edited source of the target function (raises MutantError if the
    edit does not apply exactly once)."""
    _, _, fn = _owner_and_function(mutant)
    raw = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
    source = textwrap.dedent(inspect.getsource(raw))
    count = source.count(mutant.old)
    if count != 1:
        raise MutantError(f"{mutant.name}: the edit matches {count} places in "
                          f"{mutant.module}.{mutant.qualname} (expected exactly 1)")
    return source.replace(mutant.old, mutant.new)


# Bumped by every apply: runners built before a mutant are never reused after it
# (their start-up ran the code before the edit; simrig.runners keys on this).
generation = 0
_CLASS_CELL = "_simrig_with_class_cell"


def apply(mutant: Mutant) -> None:
    """Apply ``mutant`` to the running process (irreversible: use a child process)."""
    global generation
    generation += 1
    owner, attr, fn = _owner_and_function(mutant)
    wrapper = type(fn) if isinstance(fn, (classmethod, staticmethod)) else None
    raw = fn.__func__ if wrapper else fn
    source = mutated_source(mutant)
    namespace: dict[str, Any] = {}
    if isinstance(owner, type):
        # A method's zero-argument super() reads the __class__ cell its class body gave it;
        # re-executed alone it has none, so the edited method is defined inside a function
        # whose __class__ argument is the owner.
        source = (f"def {_CLASS_CELL}(__class__):\n" + textwrap.indent(source, "    ")
                  + f"\n    return {raw.__name__}\n")
    code = compile(source, f"<mutant {mutant.name}: {inspect.getsourcefile(raw)}>", "exec")
    # A decorated function (execute_model's @torch.inference_mode()) is a
    # wrapper from another module: its source runs in the module it was
    # written in, the innermost function's.
    exec(code, inspect.unwrap(raw).__globals__, namespace)  # noqa: S102 - a mutation engine
    new_fn = namespace[_CLASS_CELL](owner) if isinstance(owner, type) else namespace[raw.__name__]
    if wrapper is not None and not isinstance(new_fn, wrapper):
        new_fn = wrapper(new_fn)
    elif hasattr(new_fn, "__qualname__"):
        new_fn.__qualname__ = raw.__qualname__
    setattr(owner, attr, new_fn)
    # Rebind copies made by "from module import name" elsewhere in vLLM.
    if not isinstance(owner, type):
        for name, module in list(sys.modules.items()):
            if name.startswith("vllm") and module is not None and getattr(module, attr, None) is raw:
                setattr(module, attr, new_fn)
