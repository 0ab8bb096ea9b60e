"""The package layout follows the one flow, and its import rules hold.

Read from the source (every ``import``, also inside functions), so a module
that starts importing across a line fails here before anyone notices.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from simrig.layout import FLOORS, MAX_MODULE_LINES, MAX_ROOM_LINES

ROOT = Path(__file__).resolve().parents[1]
SIMRIG = ROOT / "simrig"
# The rooms of the vLLM adapter: the only code that imports vllm.
VLLM_ROOMS = ("vllm_runtime", "vllm_api", "vllm_parts", "vllm_sampling", "adapters")
# The rooms of the oracle: what the real code's observations must satisfy.
ORACLE_ROOMS = ("findings", "ledger", "reference", "partition", "graph_rules", "sampling_checks", "checks")
SUBPACKAGES = ("sampling", "trace_io", "sources", "triton_interpreter", "triton_memcheck", "triton_libdevice", *VLLM_ROOMS, *ORACLE_ROOMS, "report", "history", "campaign",
               "views", "selftest", "cli", "releases", "bisect", "repro", "repro_sampling", "bench", "distributed",
               "coverage", "supervision")
# What stays directly in simrig/: the step model, harness, observations,
# progress, errors, Ctrl-C handling, the machine's memory and replay driver.
CORE = {"__init__", "__main__", "dummy_paths", "errors", "harness", "host_memory", "interrupt", "layout",
        "observe", "lifeline", "progress", "replay", "replay_run", "runners", "stage_probes", "step", "step_context",
        "trace_gate"}


# The floors (and the line limits) live in simrig/layout.py: docs/layout.md's table is
# generated from them (simrig.report.docs_tables.floors_table, tested below).


def rooms(*names: str) -> tuple[str, ...]:
    """``simrig.<name>`` for each room."""
    return tuple(f"simrig.{n}" for n in names)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in a file, absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            # "from simrig.findings import known" imports simrig.findings.known
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
        if any((SIMRIG / room) in path.parents for room in VLLM_ROOMS):
            continue
        for line, module in imported_modules(path):
            if module == "vllm" or module.startswith("vllm."):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert bad == []


@pytest.mark.parametrize("package, forbidden", [
    # the oracle reads Steps and observations (plain data) only
    *((room, (*rooms(*VLLM_ROOMS), "vllm", "simrig.campaign", "simrig.selftest", "simrig.report",
               "simrig.history", "simrig.harness", "simrig.cli"))
      for room in ORACLE_ROOMS),
    # the Finding record, known findings and finding classes, and the ledger of what is
    # judged, sit under every check: they import no other room of the oracle
    ("findings", rooms("ledger", "reference", "partition", "graph_rules", "checks")),
    ("ledger", rooms("findings", "reference", "partition", "graph_rules", "checks")),
    *((room, (*rooms(*VLLM_ROOMS), "vllm", "simrig.campaign", "simrig.selftest", "simrig.cli",
               "simrig.harness")) for room in ("report", "history")),
    # the parts of a report page: plain data in, HTML, Markdown and PNG out
    ("views", ("vllm", *rooms(*VLLM_ROOMS), *rooms(*ORACLE_ROOMS), "simrig.report", "simrig.history",
               "simrig.harness", "simrig.campaign", "simrig.selftest", "simrig.cli")),
    ("trace_io", (*rooms(*VLLM_ROOMS), "vllm", *rooms(*ORACLE_ROOMS), "simrig.sources",
                  "simrig.campaign", "simrig.selftest", "simrig.report")),
    # a request's sampling parameters sit under the step model: plain data (the standard
    # library and numpy), no other unit of simrig
    ("sampling", ("vllm", "torch", "triton", "pandas", "hypothesis",
                  *rooms(*(u for floor in FLOORS for u in floor if u not in ("sampling", "__init__"))))),
    ("sources", ("simrig.checks", "simrig.campaign", "simrig.selftest", "simrig.report")),
    *((room, (*rooms(*ORACLE_ROOMS), "simrig.report", "simrig.history", "simrig.campaign",
               "simrig.selftest", "simrig.trace_io", "simrig.sources", "simrig.harness", "simrig.replay"))
      for room in VLLM_ROOMS),
    ("campaign", ("simrig.selftest", "simrig.cli", "simrig.distributed")),
    # releases drives other vLLMs in their own processes: the driver side never
    # imports the adapters (only side.py, which runs inside a side venv, does, lazily)
    ("releases", ("simrig.selftest", "simrig.cli", "simrig.campaign",
                  "simrig.bisect", "simrig.repro", "simrig.distributed")),
    # bisect and repro run vLLM in child processes only
    ("bisect", ("vllm", *rooms(*VLLM_ROOMS), "simrig.selftest", "simrig.cli",
                "simrig.campaign", "simrig.repro", "simrig.distributed")),
    ("repro", ("vllm", *rooms(*VLLM_ROOMS), "simrig.selftest", "simrig.cli",
               "simrig.campaign", "simrig.releases", "simrig.distributed")),
    ("repro_sampling", ("vllm", *rooms(*VLLM_ROOMS), "simrig.selftest", "simrig.cli", "simrig.campaign",
                        "simrig.releases", "simrig.distributed", "simrig.repro", "simrig.bisect")),
    # the suites run in their own pytest process
    ("bench", ("vllm", *rooms(*VLLM_ROOMS), *rooms(*ORACLE_ROOMS), "simrig.report", "simrig.history",
               "simrig.selftest", "simrig.cli", "simrig.campaign",
               "simrig.distributed", "simrig.releases")),
    ("distributed", ("simrig.selftest", "simrig.cli", "vllm")),
    ("supervision", ("simrig.selftest", "simrig.cli", "simrig.distributed", "vllm")),
    ("triton_interpreter", ("vllm", *rooms(*VLLM_ROOMS), *rooms(*ORACLE_ROOMS), "simrig.harness",
                            "simrig.report", "simrig.campaign", "simrig.selftest")),
    ("triton_memcheck", ("vllm", *rooms(*VLLM_ROOMS), *rooms(*ORACLE_ROOMS), "simrig.triton_interpreter",
                         "simrig.harness", "simrig.report", "simrig.campaign", "simrig.selftest")),
    ("triton_libdevice", ("vllm", *rooms(*VLLM_ROOMS), *rooms(*ORACLE_ROOMS), "simrig.triton_interpreter",
                          "simrig.triton_memcheck", "simrig.harness", "simrig.report", "simrig.campaign",
                          "simrig.selftest")),
    ("coverage", ("vllm", *rooms(*VLLM_ROOMS), "simrig.campaign", "simrig.selftest",
                  "simrig.distributed", "simrig.cli", "simrig.report",
                  "simrig.history")),
])
def test_subpackage_import_rules(package, forbidden):
    assert violations(SIMRIG / package, forbidden) == []


def test_nothing_outside_selftest_imports_it():
    bad = []
    for path in files_under(SIMRIG):
        if (SIMRIG / "selftest") in path.parents or path == SIMRIG / "cli" / "selftest_cmd.py":
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
    if package != "selftest":
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


def unit_of(module: str) -> str | None:
    """The top-level module or room a dotted ``simrig.…`` name belongs to (None:
    not simrig's, or the bare package, whose from-imports are scanned by name)."""
    parts = module.split(".")
    if parts[0] != "simrig" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def unit_imports() -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> the places (file:line) that import it."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in files_under(SIMRIG):
        name = module_name(path)
        unit = unit_of(name) or "__init__"
        for line, module in imported_modules(path):
            target = unit_of(module)
            if target is not None and target != unit:
                edges.setdefault(unit, {}).setdefault(target, []).append(
                    f"{path.relative_to(ROOT)}:{line}")
    return edges


def test_every_unit_has_one_floor():
    units = {p.stem for p in SIMRIG.glob("*.py")} | set(SUBPACKAGES)
    placed = [u for floor in FLOORS for u in floor]
    assert sorted(placed) == sorted(set(placed)), "a unit on two floors"
    assert set(placed) == units


def test_no_import_runs_up_the_floors():
    floor_of = {u: i for i, floor in enumerate(FLOORS) for u in floor}
    bad = [f"{where} ({unit}, floor {floor_of[unit]}) imports {target} (floor {floor_of[target]})"
           for unit, targets in unit_imports().items() for target, places in targets.items()
           if floor_of[target] >= floor_of[unit] for where in places]
    assert bad == []


def cycles_between(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Every unit that reaches itself through imports, with the path found."""
    found = []
    for start in sorted(edges):
        todo, seen = [(t, [start, t]) for t in edges[start]], set()
        while todo:
            unit, path = todo.pop()
            if unit == start:
                found.append(path)
                break
            if unit in seen:
                continue
            seen.add(unit)
            todo += [(t, path + [t]) for t in edges.get(unit, {})]
    return found


def test_no_import_cycle_between_rooms():
    assert cycles_between(unit_imports()) == []


def test_the_room_cycle_scan_sees_a_cycle():
    edges = {"a": {"b": ["a.py:1"]}, "b": {"c": ["b.py:1"]}, "c": {"a": ["c.py:1"]}, "d": {"a": ["d.py:1"]}}
    assert [path[0] for path in cycles_between(edges)] == ["a", "b", "c"]


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in files_under(SIMRIG)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_room_is_over_the_line_limit():
    sizes = {room: sum(len(p.read_text().splitlines()) for p in files_under(SIMRIG / room))
             for room in SUBPACKAGES}
    assert {room: n for room, n in sizes.items() if n > MAX_ROOM_LINES} == {}


# ------------------------------------------------------------------ docs/layout.md
LAYOUT_PAGE = ROOT / "docs" / "layout.md"


def test_the_layout_page_shows_the_floors_the_test_enforces():
    from simrig.report.docs_tables import FLOORS_BEGIN, FLOORS_END, floors_table, generated_section

    assert generated_section(LAYOUT_PAGE.read_text(), FLOORS_BEGIN, FLOORS_END) == floors_table(), (
        "docs/layout.md's Floors table differs from simrig.layout.FLOORS: regenerate it "
        "(the command is on the page, under Floors)")


def test_the_floors_table_shows_every_unit_on_its_floor_once():
    from simrig.report.docs_tables import floors_table

    rows = floors_table().splitlines()[2:]
    assert [int(r.split("|")[1]) for r in rows] == list(range(len(FLOORS) - 1, -1, -1))
    shown = {u.strip(): int(r.split("|")[1]) for r in rows
             for u in r.split("|")[2].replace("`", "").split(", ") if u.strip()}
    assert shown == {u: i for i, floor in enumerate(FLOORS) for u in floor if u != "__init__"}


def test_the_layout_page_states_the_limits_and_has_a_row_per_room():
    page = LAYOUT_PAGE.read_text()
    assert f"over {MAX_MODULE_LINES} lines" in page and f"over {MAX_ROOM_LINES:,} lines" in page
    missing = [room for room in SUBPACKAGES if f"| `simrig/{room}/` |" not in page]
    assert missing == [], f"docs/layout.md has no row for simrig/{missing}"


def test_a_regenerated_page_replaces_only_its_section():
    from simrig.report.docs_tables import generated_section, with_section

    page = "head\n<!-- a -->\nold\n<!-- b -->\ntail\n"
    new = with_section(page, "<!-- a -->", "<!-- b -->", "| new |")
    assert new == "head\n<!-- a -->\n| new |\n<!-- b -->\ntail\n"
    assert generated_section(new, "<!-- a -->", "<!-- b -->") == "| new |"
    assert generated_section("no markers", "<!-- a -->", "<!-- b -->") == ""
