"""Imports sit at the module top; one inside a function says why.

An import inside a function is the exception (vLLM loaded only after
``platform.configure``, a heavy package kept off a cold path such as ``simrig --help``,
an optional package, a cycle, a name tests monkeypatch): it carries a comment on its
line, or on the line above the block of imports it belongs to. Read from the source
(``ast``), nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIMRIG = ROOT / "simrig"

# Modules whose owners are rewriting them now: they join the rule when done (the goal
# is this tuple empty).
PENDING: tuple[str, ...] = ()


def all_modules() -> tuple[str, ...]:
    return tuple(sorted(p.relative_to(ROOT).as_posix() for p in SIMRIG.rglob("*.py")))


def unexplained_imports(source: str) -> list[int]:
    """The lines of the imports inside a function that no comment explains: none on the
    import's own lines, none on the line above the run of import lines it stands in."""
    lines = source.splitlines()
    tree = ast.parse(source)
    import_lines = {n for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for n in range(node.lineno, node.end_lineno + 1)}
    nested: list[ast.stmt] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                nested.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    bad = []
    for node in nested:
        first = node.lineno
        while first - 1 in import_lines:  # the run of import lines this one stands in
            first -= 1
        last = node.end_lineno
        while last + 1 in import_lines:
            last += 1
        run = lines[first - 1:last]
        above = lines[first - 2].strip() if first > 1 else ""
        if not any("#" in line for line in run) and not above.startswith("#"):
            bad.append(node.lineno)
    return bad


def test_pending_modules_exist() -> None:
    assert [m for m in PENDING if not (ROOT / m).is_file()] == []


@pytest.mark.parametrize("path", [m for m in all_modules() if m not in PENDING])
def test_imports_inside_functions_say_why(path: str) -> None:
    bad = unexplained_imports((ROOT / path).read_text())
    assert bad == [], (f"{path}: import(s) inside a function at line(s) {bad} without a comment "
                       "saying why; move them to the module top, or say why they stay")


def test_the_scan_sees_an_unexplained_import() -> None:
    source = ("import os\n\n\ndef f():\n    import json\n    return json\n\n\n"
              "def g():\n    # cold path: keeps json off start-up\n    import json\n    import re\n"
              "    return json, re\n\n\ndef h():\n    import json  # optional\n\n    import re\n")
    assert unexplained_imports(source) == [5, 19]
