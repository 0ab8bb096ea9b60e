"""``wiring.equip`` against the installed release's ``GPUModelRunner.__init__``.

Every attribute ``__init__`` sets (each ``self.X = ...`` / ``self.X: T = ...`` target, tuple
targets included, read with ``inspect.getsource`` + ``ast``) is either set by ``equip`` on a
runner built as simrig builds it, or listed in ``wiring.NOT_NEEDED`` with its reason; a listed
one is read only by the start-up methods simrig replaces with ``equip`` or by a method its
reason names. The other way round, an attribute ``equip`` sets that ``__init__`` never sets
and no MRV2 code reads is dead (unless ``wiring.FOR_OTHER_RELEASES`` says which release
reads it).

Run it under a side venv's interpreter to check that release
(``PYTHONPATH=$PWD .venvs/vllm-0.30.0/bin/python -m pytest -q tests/test_equip_attributes.py``),
or set ``SIMRIG_SIDE_VENV`` (``.ci/run`` does) to check the side release too, from a child
process in that venv, beside the installed one.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The runner's start-up: __init__, the methods and the functions handed the runner that vLLM's
# worker calls before the first step (loading, KV cache, memory profiling of the graphs, kernel
# warmup), all replaced by equip (simrig never calls them; test below).
START_UP = {"__init__", "load_model", "initialize_kv_cache", "_init_kv_zero_meta",
            "get_supported_tasks", "update_config",
            "profile_cudagraph_memory", "_init_minimal_kv_cache_for_profiling", "_teardown_profiling_state",
            "warmup_kernels", "_warmup_kernels", "run_mixed_prefill_decode_warmup", "_warmup_block_counter"}


def self_targets(function: ast.AST) -> set[str]:
    """Every ``self.X`` assigned in ``function`` (plain, annotated, augmented, tuple targets)."""
    out: set[str] = set()

    def target(node: ast.AST) -> None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            out.add(node.attr)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                target(element)
        elif isinstance(node, ast.Starred):
            target(node.value)

    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            target(node.target)
    return out


def report() -> dict[str, Any]:
    """The installed release's facts: what __init__ sets, what equip sets on a runner built as
    simrig builds it, which methods read each attribute, which names MRV2 code reads."""
    import inspect

    from simrig.adapters import runner as adapter, wiring
    from simrig.step import RunnerConfig

    api = adapter.load()  # first: it picks the CPU platform before vLLM is imported
    import vllm.v1.worker.gpu as mrv2

    cls = api.GPUModelRunner
    init = self_targets(ast.parse(textwrap.dedent(inspect.getsource(cls.__init__))))
    built = api.build_runner(RunnerConfig(max_num_reqs=2, max_num_batched_tokens=16, max_model_len=64))
    class_tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    readers: dict[str, set[str]] = {}
    for method in class_tree.body[0].body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(method):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                        and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    readers.setdefault(node.attr, set()).add(method.name)
    # every attribute name MRV2 loads (x.name or getattr(x, "name")), the LoRA mixin's included;
    # a module-level function handed the runner (a parameter runner / model_runner) reads too
    files = sorted(Path(mrv2.__file__).parent.rglob("*.py"))
    files.append(Path(mrv2.__file__).parents[1] / "lora_model_runner_mixin.py")
    reads: set[str] = set()
    for path in files:
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text())
        for function in tree.body:
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = {a.arg for a in function.args.args} & {"runner", "model_runner"}
            for node in ast.walk(function):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                        and isinstance(node.value, ast.Name) and node.value.id in params):
                    readers.setdefault(node.attr, set()).add(function.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                reads.add(node.attr)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)):
                reads.add(str(node.args[1].value))
    return {"version": api.version, "init": sorted(init), "equipped": sorted(vars(built)),
            "readers": {k: sorted(v) for k, v in readers.items()}, "mrv2_reads": sorted(reads),
            "not_needed": wiring.NOT_NEEDED, "for_other_releases": wiring.FOR_OTHER_RELEASES}


def _side_report(side: str) -> dict[str, Any]:
    python = Path(side) / "bin" / "python"
    assert python.exists(), f"SIMRIG_SIDE_VENV={side}: no bin/python (run simrig env create)"
    proc = subprocess.run([str(python), __file__], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_REPORTS: dict[str, dict[str, Any]] = {}


def _report(where: str) -> dict[str, Any]:
    if where not in _REPORTS:
        _REPORTS[where] = report() if where == "installed" else _side_report(where)
    return _REPORTS[where]


WHERE = ["installed"] + ([os.environ["SIMRIG_SIDE_VENV"]] if os.environ.get("SIMRIG_SIDE_VENV") else [])


@pytest.mark.vllm
@pytest.mark.parametrize("where", WHERE)
def test_every_attribute_init_sets_is_equipped_or_listed_as_not_needed(where):
    r = _report(where)
    init, equipped, listed = set(r["init"]), set(r["equipped"]), set(r["not_needed"])
    missing = sorted(init - equipped - listed)
    assert not missing, (f"vLLM {r['version']}: GPUModelRunner.__init__ sets {missing}; equip sets "
                         "none of them and wiring.NOT_NEEDED does not list them (with a reason)")
    both = sorted(listed & equipped)
    assert not both, f"vLLM {r['version']}: {both} listed as not needed, yet equip sets them"
    stale = sorted(listed - init)
    assert not stale, f"vLLM {r['version']}: wiring.NOT_NEEDED lists {stale}, which __init__ no longer sets"


@pytest.mark.vllm
@pytest.mark.parametrize("where", WHERE)
def test_an_attribute_listed_as_not_needed_is_read_only_at_start_up(where):
    r = _report(where)
    wrong = {}
    for name, reason in r["not_needed"].items():
        named = set(re.findall(r"`(\w+)`", reason))  # a method simrig runs, named with its guard
        outside = sorted(set(r["readers"].get(name, [])) - START_UP - named)
        if outside:
            wrong[name] = outside
    assert not wrong, (f"vLLM {r['version']}: read by methods simrig runs, and the reason in "
                       f"wiring.NOT_NEEDED names none of them: {wrong}")


@pytest.mark.vllm
@pytest.mark.parametrize("where", WHERE)
def test_no_attribute_equip_sets_is_dead(where):
    r = _report(where)
    dead = sorted(set(r["equipped"]) - set(r["init"]) - set(r["mrv2_reads"]) - set(r["for_other_releases"]))
    assert not dead, (f"vLLM {r['version']}: equip sets {dead}, which GPUModelRunner.__init__ never "
                      "sets and no MRV2 code reads: drop them, or list the release that reads them "
                      "in wiring.FOR_OTHER_RELEASES")
    for name, reason in r["for_other_releases"].items():
        assert re.search(r"\d+\.\d+\.\d+", reason), f"FOR_OTHER_RELEASES[{name!r}] names no release"


def test_simrig_never_runs_the_start_up_methods_equip_replaces():
    calls = []
    for path in sorted((ROOT / "simrig").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = (node.func.attr if isinstance(node.func, ast.Attribute) else
                      node.func.id if isinstance(node.func, ast.Name) else "")
            if called in START_UP - {"__init__"}:
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno} {called}")
    assert not calls, f"simrig calls a start-up method equip stands for: {calls}"


def test_the_target_reader_sees_every_form_of_assignment():
    source = textwrap.dedent("""
        def __init__(self, a):
            self.plain = a
            self.annotated: int = 1
            self.left, (self.nested, self.star) = a
            if a:
                self.in_branch = [x for x in a]
            self.counter += 1
            other.not_self = 2
            self.read_only.attr = 3
    """)
    assert self_targets(ast.parse(source)) == {"plain", "annotated", "left", "nested", "star", "in_branch",
                                               "counter"}


if __name__ == "__main__":  # the child a side venv's interpreter runs (see _side_report)
    sys.path.insert(0, str(ROOT))
    print(json.dumps(report()))
