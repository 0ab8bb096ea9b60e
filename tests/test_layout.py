"""The package layout follows the one flow, and its import rules hold.

Read from the source (every ``import``, also inside functions), so a module
that starts importing across a line fails here before anyone notices.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIMRIG = ROOT / "simrig"
SUBPACKAGES = ("sources", "adapters", "checks", "report", "campaign", "selftest", "commands",
               "releases", "bisect", "repro", "bench", "distributed", "coverage")
# What stays directly in simrig/: the step model, harness, observations,
# progress, errors, Ctrl-C handling, replay driver and cli.
CORE = {"__init__", "__main__", "cli", "dummy_paths", "errors", "harness", "interrupt", "observe",
        "progress", "replay", "runners", "stage_probes", "step"}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in a file, absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            # "from simrig.checks import findings" imports simrig.checks.findings
            out.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return out


def files_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def violations(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in files_under(folder):
        for line, module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return bad


def test_only_adapters_import_vllm():
    bad = []
    for path in files_under(SIMRIG) + files_under(ROOT / "strategies"):
        if (SIMRIG / "adapters") in path.parents:
            continue
        for line, module in imported_modules(path):
            if module == "vllm" or module.startswith("vllm."):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


@pytest.mark.parametrize("package, forbidden", [
    ("checks", ("simrig.adapters", "simrig.campaign", "simrig.selftest", "simrig.report",
                "simrig.harness", "simrig.commands", "simrig.cli")),
    ("report", ("simrig.campaign", "simrig.selftest", "simrig.adapters", "simrig.commands")),
    ("sources", ("simrig.checks.checker", "simrig.campaign", "simrig.selftest", "simrig.report")),
    ("adapters", ("simrig.checks", "simrig.report", "simrig.campaign", "simrig.selftest",
                  "simrig.sources", "simrig.harness", "simrig.replay")),
    ("campaign", ("simrig.selftest", "simrig.commands", "simrig.distributed")),
    # releases drives other vLLMs in their own processes: the driver side never
    # imports the adapters (only side.py, which runs inside a side venv, does, lazily)
    ("releases", ("simrig.selftest", "simrig.commands", "simrig.campaign", "simrig.bisect",
                  "simrig.repro", "simrig.distributed")),
    # bisect and repro run vLLM in child processes only
    ("bisect", ("vllm", "simrig.adapters", "simrig.selftest", "simrig.commands", "simrig.campaign",
                "simrig.repro", "simrig.distributed")),
    ("repro", ("vllm", "simrig.adapters", "simrig.selftest", "simrig.commands", "simrig.campaign",
               "simrig.releases", "simrig.distributed")),
    # the suites run in their own pytest process
    ("bench", ("vllm", "simrig.adapters", "simrig.checks", "simrig.report", "simrig.selftest",
               "simrig.commands", "simrig.campaign", "simrig.distributed", "simrig.releases")),
    ("distributed", ("simrig.selftest", "simrig.commands", "vllm")),
    ("coverage", ("vllm", "simrig.adapters", "simrig.campaign", "simrig.selftest",
                  "simrig.distributed", "simrig.commands")),
])
def test_subpackage_import_rules(package, forbidden):
    assert violations(SIMRIG / package, forbidden) == []


def test_nothing_outside_selftest_imports_it():
    bad = []
    for path in files_under(SIMRIG):
        if (SIMRIG / "selftest") in path.parents or path.parent == SIMRIG / "commands":
            continue
        for line, module in imported_modules(path):
            if module == "simrig.selftest" or module.startswith("simrig.selftest."):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


def test_the_top_level_holds_only_the_core():
    top = {p.stem for p in SIMRIG.glob("*.py")}
    assert top == CORE
    folders = {p.name for p in SIMRIG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(SUBPACKAGES)


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_every_subpackage_says_what_it_is_and_may_import(package):
    doc = ast.get_docstring(ast.parse((SIMRIG / package / "__init__.py").read_text()))
    assert doc and len(doc.split()) >= 20, f"simrig/{package}/__init__.py needs its paragraph"
    if package not in ("commands", "selftest"):
        assert "import" in doc, "the docstring says what the package may import"


def test_the_scanner_sees_nested_and_from_imports(tmp_path):
    (tmp_path / "mod.py").write_text(
        "def f():\n    from vllm.v1 import x\n\nfrom simrig import selftest\n")
    found = imported_modules(tmp_path / "mod.py")
    assert (2, "vllm.v1") in found and (4, "simrig.selftest") in found


def test_no_import_cycle_inside_a_subpackage():
    """A module never imports (directly or through others) a module that imports it."""
    edges: dict[str, set[str]] = {}
    for path in files_under(SIMRIG):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        edges[name] = {m for _, m in imported_modules(path) if m.startswith("simrig.")}
    cycles = []
    for start in edges:
        package = start.rsplit(".", 1)[0]
        seen, todo = set(), [m for m in edges[start] if m.startswith(package + ".")]
        while todo:
            module = todo.pop()
            if module == start:
                cycles.append(start)
                break
            if module in seen or module not in edges:
                continue
            seen.add(module)
            todo += [m for m in edges[module] if m.startswith(package + ".")]
    assert cycles == []


def test_the_cycle_scan_sees_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "simrig" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from simrig.pkg.b import g\n")
    (pkg / "b.py").write_text("from simrig.pkg import a\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "SIMRIG", tmp_path / "simrig")
    with pytest.raises(AssertionError):
        test_no_import_cycle_inside_a_subpackage()
