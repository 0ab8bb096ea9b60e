"""Every release is judged by one meaning: a per-release branch in the oracle is
either an accepted difference (reports/baselines/release-differences.json, with its
evidence in vLLM's code) or it is not allowed (a behaviour one release has and
another lacks is judged by the documented meaning and listed as a version-ranged
known finding in reports/baselines/known-findings.json).

The oracle is simrig/checks/ and the rooms below it (``ORACLE_ROOMS``: findings,
ledger, reference, partition, graph_rules). A *per-release branch* is code there that reads the release or a
release-derived fact: a name or attribute from ``RELEASE_NAMES`` (the version, the
adapter's ``ApiShape`` flags, a stage's ``declared`` fields), or a field name that
only some releases have (the fields whose presence differs between the committed
contract snapshots, ``reports/baselines/contract-vllm-*.json``, and the lifecycle's
``runner.pcp_size``, which the harness sets to 1 where the release cannot drive
the trace's PCP world) tested for presence, indexed or looked up. Each is named
(module, function, marker).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.test_layout import ORACLE_ROOMS

ROOT = Path(__file__).resolve().parents[1]
SIMRIG = ROOT / "simrig"
BASELINES = ROOT / "reports" / "baselines"
DIFFERENCES = BASELINES / "release-differences.json"
# known.py is the version-range machinery of item (b) itself: it reads the release
# to choose which documented findings apply, never what is right; classes.py groups
# findings into classes with the verdict those known findings give.
NOT_SCANNED = ("known.py", "classes.py")
RELEASE_NAMES = frozenset({"version", "vllm_version", "installed_vllm_version", "release", "in_range",
                           "release_tuple", "__version__", "declared", "ApiShape", "capabilities",
                           "unavailable"})
RELEASE_DERIVED_FIELDS = frozenset({"runner.pcp_size"})
KINDS = ("api", "contract", "known_findings", "not_a_judgement")


def api_shape_flags() -> frozenset[str]:
    """The fields of simrig.vllm_api.versions.ApiShape, read from its source (no vLLM import)."""
    tree = ast.parse((ROOT / "simrig" / "vllm_api" / "versions.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ApiShape":
            return frozenset(s.target.id for s in node.body
                             if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))
    raise AssertionError("simrig/vllm_api/versions.py has no ApiShape")


def release_specific_fields() -> frozenset[str]:
    """Top-level field names present in some committed contract snapshots and not in others."""
    sets = []
    for path in sorted(BASELINES.glob("contract-vllm-*.json")):
        stages = json.loads(path.read_text(encoding="utf-8"))["stages"]
        sets.append({name.split(".")[0] for fields in stages.values() for name in fields})
    assert len(sets) >= 2, "the contract snapshots of at least two releases are committed"
    return frozenset(set.union(*sets) - set.intersection(*sets)) | RELEASE_DERIVED_FIELDS


def _strings(node: ast.AST) -> tuple[str, ...] | None:
    """A str constant, or a tuple/list of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None


def _bindings(body: list[ast.stmt], nested: bool = True) -> dict[str, tuple[str, ...]]:
    """Names bound to a str constant (or a tuple of them) by ``body``'s statements
    (and, when ``nested``, by the statements inside them)."""
    out = {}
    for stmt in body:
        for sub in ast.walk(stmt) if nested else (stmt,):
            if isinstance(sub, (ast.Assign, ast.AnnAssign)) and sub.value is not None:
                values = _strings(sub.value)
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                for t in targets:
                    if values is not None and isinstance(t, ast.Name):
                        out[t.id] = values
    return out


def find_release_branches(source: str, module: str, names: frozenset[str],
                          fields: frozenset[str]) -> set[tuple[str, str, str]]:
    """(module, function, marker) for every per-release branch of ``source``."""
    tree = ast.parse(source)
    module_consts = _bindings(tree.body, nested=False)
    found: set[tuple[str, str, str]] = set()

    def release_field(value: str) -> str | None:
        for name in (value, value.split(".")[0]):
            if name in fields:
                return name
        return None

    def field_marks(expr: ast.AST, consts: dict[str, tuple[str, ...]]) -> set[str]:
        values = _strings(expr)
        if values is None and isinstance(expr, ast.Name):
            values = consts.get(expr.id)
        return {f"field:{f}" for f in map(release_field, values or ()) if f}

    def visit(node: ast.AST, func: str, consts: dict[str, tuple[str, ...]]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qual = node.name if func == "<module>" else f"{func}.{node.name}"
            local = dict(consts)
            if not isinstance(node, ast.ClassDef):
                local.update(_bindings(node.body))
                args = node.args
                for a in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                    if a.arg in names:
                        found.add((module, qual, a.arg))
            for child in ast.iter_child_nodes(node):
                visit(child, qual, local)
            return
        mark = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.arg if isinstance(node, ast.keyword) else None)
        if mark in names:
            found.add((module, func, mark))
        tested: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            tested = [node.left, *node.comparators]
        elif isinstance(node, ast.Subscript):
            tested = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            tested = node.args[:1]
        if isinstance(node, ast.Name) and func != "<module>" and node.id in consts:
            tested.append(node)  # a named tuple of field names used inside a function
        for expr in tested:
            found.update((module, func, m) for m in field_marks(expr, consts))
        for child in ast.iter_child_nodes(node):
            visit(child, func, consts)

    visit(tree, "<module>", module_consts)
    return {hit for hit in found if hit[1] != "<module>"}


def scanned_branches() -> set[tuple[str, str, str]]:
    names = RELEASE_NAMES | api_shape_flags()
    fields = release_specific_fields()
    out: set[tuple[str, str, str]] = set()
    for path in sorted(p for room in ORACLE_ROOMS for p in (SIMRIG / room).glob("*.py")):
        if path.name not in NOT_SCANNED:
            out |= find_release_branches(path.read_text(encoding="utf-8"), path.stem, names, fields)
    return out


def registered() -> dict[tuple[str, str, str], str]:
    doc = json.loads(DIFFERENCES.read_text(encoding="utf-8"))
    out = {}
    for entry in doc["differences"]:
        for b in entry["branches"]:
            out[(b["module"], b["function"], b["marker"])] = entry["id"]
    return out


# ------------------------------------------------------------------ the detector can fail
SNIPPET = '''
SW_FIELDS = ("pcp.global_num_tokens", "num_tokens")

def judge(stage, shape, nulls_below_window=None):
    if shape.nulls_below_window:
        return 1
    if "decode_graph_eligible" in stage.fields:
        return 2
    meta = stage.fields.get("pcp")
    for name in SW_FIELDS:
        pass
    return stage.fields["num_tokens"]

def plain(stage):
    return "num_tokens" in stage.fields and stage.shape[0] > 1
'''


def test_the_detector_names_each_kind_of_release_branch_in_a_snippet():
    names = RELEASE_NAMES | api_shape_flags()
    fields = release_specific_fields()
    assert find_release_branches(SNIPPET, "snippet", names, fields) == {
        ("snippet", "judge", "nulls_below_window"),  # an ApiShape flag (argument and attribute)
        ("snippet", "judge", "field:decode_graph_eligible"),  # presence of a 0.31+ field
        ("snippet", "judge", "field:pcp"),  # lookup of a 0.33 field; a tuple naming one
    }


def test_the_snapshots_name_the_fields_that_differ_between_releases():
    fields = release_specific_fields()
    assert {"decode_graph_eligible", "pcp", "dcp_local_seq_lens_cpu_upper_bound"} <= fields
    assert "logits_indices" not in fields and "req_ids" not in fields


# ------------------------------------------------------------------ the checks
def test_every_per_release_branch_in_the_checks_is_an_accepted_difference():
    """A branch in neither list fails here: judge it by the documented meaning
    (a known finding for the releases that differ) or register it with evidence."""
    found = scanned_branches()
    listed = registered()
    unlisted = sorted(found - set(listed))
    assert not unlisted, ("per-release branches in the oracle not in "
                          f"{DIFFERENCES.relative_to(ROOT)}: {unlisted}")
    stale = sorted(set(listed) - found)
    assert not stale, f"listed branches no longer in the oracle (remove them): {stale}"


def test_the_blocks_check_has_no_per_release_branch():
    """Sliding-window entries below the window are judged null on every release;
    0.30.0-0.32.0 keep them (a bug 0.33.0 fixed): a known finding, not a branch."""
    assert not {b for b in scanned_branches() if b[0] == "blocks"}


def test_each_accepted_difference_carries_evidence():
    doc = json.loads(DIFFERENCES.read_text(encoding="utf-8"))
    ids = [e["id"] for e in doc["differences"]]
    assert len(ids) == len(set(ids)), "ids are unique"
    for entry in doc["differences"]:
        assert entry["kind"] in KINDS, entry["id"]
        assert entry["branches"], entry["id"]
        assert entry["summary"] and entry["why_not_a_bug"], entry["id"]
        if entry["kind"] in ("known_findings", "not_a_judgement"):
            continue
        assert entry["evidence"], entry["id"]
        for ev in entry["evidence"]:
            assert ev["file"].startswith("vllm/") and ev["release"] in ("0.30.0", "0.31.0", "0.32.0", "0.33.0")
            assert isinstance(ev["line"], int) and ev["line"] > 0 and ev["text"], entry["id"]


@pytest.mark.parametrize("entry", json.loads(DIFFERENCES.read_text(encoding="utf-8"))["differences"],
                         ids=lambda e: e["id"])
def test_the_evidence_is_on_the_line_it_names(entry):
    """Evidence quoted from a release whose source is here (the installed vLLM, or
    SIMRIG_VLLM_SOURCES/<release>, see tests/test_history_corpus.py) is on its line."""
    from tests.test_history_corpus import _source

    checked = 0
    for ev in entry.get("evidence", ()):
        root = _source(ev["release"])
        if root is None:
            continue
        lines = (root / ev["file"]).read_text(encoding="utf-8").splitlines()
        assert ev["text"] in lines[ev["line"] - 1], (ev["release"], ev["file"], ev["line"], ev["text"])
        checked += 1
    if not checked:
        pytest.skip("no quoted release's source is present")
