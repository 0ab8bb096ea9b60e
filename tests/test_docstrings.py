"""Module docstrings stay short and true.

A module docstring says what the module is for in a few lines and points to the
docs page where the rest lives; every path, dotted name and docs section it
mentions must exist. Read from the source (``ast``), nothing is imported.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIMRIG = ROOT / "simrig"
MAX_DOCSTRING_LINES = 15

# The modules whose docstrings have been rewritten. The rest of the package joins
# as its owners finish theirs: the goal is `checked_modules()` returning
# `all_modules()`, i.e. this tuple replaced by every module (one line).
MODULES_DONE = (
    "simrig/adapters/reuse.py",
    "simrig/adapters/sampling.py",
    "simrig/adapters/standins.py",
    "simrig/adapters/wiring.py",
    "simrig/bench/runner.py",
    "simrig/bench/saves.py",
    "simrig/bisect/points.py",
    "simrig/bisect/search.py",
    "simrig/campaign/fuzz.py",
    "simrig/campaign/pytest_plugin.py",
    "simrig/campaign/report.py",
    "simrig/checks/fields.py",
    "simrig/cli/__init__.py",
    "simrig/cli/__main__.py",
    "simrig/cli/bench_cmd.py",
    "simrig/cli/bisect_cmd.py",
    "simrig/cli/compare_cmd.py",
    "simrig/cli/contract_cmd.py",
    "simrig/cli/coverage_cmd.py",
    "simrig/cli/demo_cmd.py",
    "simrig/cli/dispatch.py",
    "simrig/cli/doctor_cmd.py",
    "simrig/cli/env_cmd.py",
    "simrig/cli/flags.py",
    "simrig/cli/fuzz_cmd.py",
    "simrig/cli/history_cmd.py",
    "simrig/cli/import_cmd.py",
    "simrig/cli/record_cmd.py",
    "simrig/cli/replay_cmd.py",
    "simrig/cli/repro_cmd.py",
    "simrig/cli/selftest_cmd.py",
    "simrig/coverage/collect.py",
    "simrig/coverage/reasons.py",
    "simrig/distributed/__init__.py",
    "simrig/distributed/cluster.py",
    "simrig/distributed/fuzz_shards.py",
    "simrig/distributed/replay_shards.py",
    "simrig/findings/classes.py",
    "simrig/findings/known.py",
    "simrig/graph_rules/lora.py",
    "simrig/graph_rules/padded_attn.py",
    "simrig/graph_rules/padding.py",
    "simrig/history/branches.py",
    "simrig/history/changes.py",
    "simrig/history/store.py",
    "simrig/ledger/call_sites.py",
    "simrig/lifeline.py",
    "simrig/partition/pcp_layout.py",
    "simrig/reference/blocks.py",
    "simrig/reference/contract.py",
    "simrig/reference/reference.py",
    "simrig/reference/semantics.py",
    "simrig/releases/envs.py",
    "simrig/replay_run.py",
    "simrig/report/profile.py",
    "simrig/report/timing.py",
    "simrig/report/writer.py",
    "simrig/repro/__init__.py",
    "simrig/repro/impact.py",
    "simrig/repro/pytest_file.py",
    "simrig/repro/upstream.py",
    "simrig/runners.py",
    "simrig/selftest/scoreboard.py",
    "simrig/sources/sampler.py",
    "simrig/sources/workloads.py",
    "simrig/supervision/campaign.py",
    "simrig/supervision/forked.py",
    "simrig/trace_gate.py",
    "simrig/views/summary_md.py",
    "simrig/vllm_parts/cudagraph.py",
    "simrig/vllm_parts/lora.py",
    "simrig/vllm_runtime/overlay.py",
)


def all_modules() -> tuple[str, ...]:
    """Every module of the package, as a path relative to the repository root."""
    return tuple(sorted(p.relative_to(ROOT).as_posix() for p in SIMRIG.rglob("*.py")))


def checked_modules() -> tuple[str, ...]:
    """The modules held to the rule now (all_modules() once everyone is done)."""
    return MODULES_DONE


def module_docstring(path: str) -> tuple[str, int]:
    """The module docstring's text and the number of source lines it spans."""
    tree = ast.parse((ROOT / path).read_text())
    text = ast.get_docstring(tree, clean=False)
    if text is None:
        return "", 0
    node = tree.body[0]
    return text, node.end_lineno - node.lineno + 1


# `simrig/x/y.py`, `simrig/x/`, `docs/page.md` as written in prose.
PATH = re.compile(r"(?<![\w./])((?:simrig|docs|tests|scripts)/[\w./-]*[\w/])")
# `simrig.x.y` dotted names (a module, or a module then attributes).
DOTTED = re.compile(r"(?<![\w./])(simrig(?:\.\w+)+)")
# A pointer into the docs: docs/page.md, 'Section' (or "Section").
SECTION = re.compile(r"(docs/[\w-]+\.md),?\s+['\"“‘]([^'\"”’]+)['\"”’]")


def top_level_names(tree: ast.Module) -> dict[str, ast.AST]:
    """Names a module defines or imports at its top level (and inside if/try blocks)."""
    names: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names[n.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))

    visit(tree.body)
    return names


def dotted_name_exists(name: str) -> bool:
    """``simrig.a.b[.Attr[.member]]`` names a module, or a name defined in one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                rest = parts[cut:]
                if not rest:
                    return True
                names = top_level_names(ast.parse(candidate.read_text()))
                if rest[0] not in names:
                    # a submodule of a package, imported lazily
                    return False
                node = names[rest[0]]
                if len(rest) > 1 and isinstance(node, ast.ClassDef):
                    members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                            ast.ClassDef))}
                    members |= {t.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                                for t in ast.walk(n) if isinstance(t, ast.Name)}
                    return rest[1] in members
                return True
    return False


@functools.lru_cache(maxsize=1)
def code_names() -> frozenset[str]:
    """Every name the project's code defines or uses (never its docstrings or comments),
    the identifier-like string constants (field names, stage names), and pyproject's words."""
    names: set[str] = set()
    for folder in ("simrig", "strategies", "tests", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.resolve() == Path(__file__).resolve():
                continue  # its own made-up names must stay unknown
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Name):
                    names.add(node.id)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.arg):
                    names.add(node.arg)
                elif isinstance(node, ast.keyword) and node.arg:
                    names.add(node.arg)
                elif isinstance(node, ast.alias):
                    names.update((node.asname or node.name).split("."))
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and re.fullmatch(r"[A-Za-z_]\w*", node.value):
                    names.add(node.value)
        names.update(path.stem for path in (ROOT / folder).rglob("*.py"))
    names.update(re.findall(r"\w+", (ROOT / "pyproject.toml").read_text()))
    return frozenset(names)


# The installed code simrig drives and patches, whose names its docstrings cite.
DRIVEN_PACKAGES = ("vllm", "triton")


@functools.lru_cache(maxsize=1)
def vllm_words() -> frozenset[str]:
    """Every word of the installed vLLM's (and Triton's) source: its names, and the words its
    docs cite."""
    words: set[str] = set()
    for package in DRIVEN_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for path in Path(list(spec.submodule_search_locations)[0]).rglob("*.py"):
            words.update(re.findall(r"\w+", path.read_text(errors="ignore")))
    return frozenset(words)


# ``name``, ``module.name`` or ``name()`` in a docstring: a name the reader may look up.
LITERAL_NAME = re.compile(r"``([A-Za-z_][\w.]*)(?:\(\))?``")


def unknown_literal_names(text: str) -> list[str]:
    """The ``literal`` names of ``text`` that neither the project's code nor vLLM's source has."""
    return [n for n in LITERAL_NAME.findall(text) if not n.startswith("simrig.")  # dotted_name_exists
            and n.split(".")[-1] not in code_names() and n.split(".")[-1] not in vllm_words()]


def docs_headings(page: Path) -> list[str]:
    """A page's headings, and the bold lead-ins that open its paragraphs (``**What it costs.**``)."""
    lines = page.read_text().splitlines()
    heads = [line.lstrip("#").strip().strip("`") for line in lines if line.startswith("#")]
    heads += [m.group(1) for line in lines if (m := re.match(r"\*\*(.+?)\*\*", line))]
    return heads


def test_modules_done_exist() -> None:
    missing = [m for m in MODULES_DONE if not (ROOT / m).is_file()]
    assert not missing, f"MODULES_DONE names modules that do not exist: {missing}"


@pytest.mark.parametrize("path", checked_modules())
def test_module_docstring_short(path: str) -> None:
    text, lines = module_docstring(path)
    assert text.strip(), f"{path}: no module docstring"
    assert lines <= MAX_DOCSTRING_LINES, (
        f"{path}: module docstring spans {lines} lines (at most {MAX_DOCSTRING_LINES}); "
        "move the detail to its docs page or to the function it documents")


@pytest.mark.parametrize("path", checked_modules())
def test_module_docstring_names_exist(path: str) -> None:
    text, _ = module_docstring(path)
    wrong = []
    for p in PATH.findall(text):
        p = p.rstrip(".")
        if not (ROOT / p).exists():
            wrong.append(f"path {p}")
    for name in DOTTED.findall(text):
        if not dotted_name_exists(name):
            wrong.append(f"name {name}")
    wrong += [f"name {n}" for n in unknown_literal_names(text)]
    flat = " ".join(text.split())
    for page, section in SECTION.findall(flat):
        if not (ROOT / page).is_file():
            continue  # reported as a path above
        if not any(section.strip().lower() in h.lower() for h in docs_headings(ROOT / page)):
            wrong.append(f"section {section!r} of {page}")
    assert not wrong, f"{path}: its module docstring mentions what does not exist: {wrong}"


def test_checker_catches_a_wrong_name(tmp_path: Path) -> None:
    """The resolver itself can fail: a made-up name and a made-up path are caught."""
    assert dotted_name_exists("simrig.graph_rules.padding")
    assert not dotted_name_exists("simrig.graph_rules.no_such_module")
    assert not dotted_name_exists("simrig.lifeline.no_such_function")
    assert PATH.findall("see simrig/nowhere.py.") == ["simrig/nowhere.py"]
    assert unknown_literal_names("``check_dispatch``, ``GPUModelRunner.execute_model``") == []
    assert unknown_literal_names("``check_the_moon``") == ["check_the_moon"]
