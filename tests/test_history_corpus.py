"""reports/baselines/history.csv: vLLM's changes to the input path between releases.

Its form, its links to the known findings, and — where the older releases' sources are
present (``SIMRIG_VLLM_SOURCES``, default /tmp/vllm-src/<release>/; the installed vLLM
stands for its own release) — that every changed file under vllm/v1/worker/gpu/ has a row.
No network: without older sources only the file's own consistency is checked.
"""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

import pytest

from simrig.findings.known import in_range
from simrig.report.docs_tables import HISTORY_COLUMNS, HISTORY_KINDS, read_history

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "reports" / "baselines" / "history.csv"
RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")
STEPS = tuple(zip(RELEASES, RELEASES[1:]))
GPU = "vllm/v1/worker/gpu/"


def _rows() -> list[dict[str, str]]:
    return read_history(HISTORY)


def _known_entries() -> dict[str, dict]:
    out = {}
    for path in sorted((ROOT / "reports" / "baselines").glob("known-findings*.json")):
        for i, entry in enumerate(json.loads(path.read_text(encoding="utf-8"))["findings"]):
            out[f"{path.name}#{i}"] = entry
    return out


def test_the_csv_has_its_columns_and_valid_values():
    assert HISTORY.read_text(encoding="utf-8").splitlines()[0] == ",".join(HISTORY_COLUMNS)
    rows = _rows()
    assert rows
    for n, r in enumerate(rows, start=2):
        assert (r["from_release"], r["to_release"]) in STEPS, n
        assert r["kind"] in HISTORY_KINDS, n
        assert r["file"].startswith(("vllm/v1/worker/", "vllm/config/")), n
        assert r["cpu_reachable"] in ("yes", "no", ""), n
        assert r["summary"], n
        if r["kind"] in ("bug_fix", "regression", "feature", "refactor", "api_change"):
            assert r["cpu_reachable"], f"line {n}: a classified change says whether the rig reaches it"
    keys = [(r["from_release"], r["to_release"], r["file"], r["lines"], r["summary"]) for r in rows]
    assert len(keys) == len(set(keys)), "no row twice"
    for a, b in STEPS:
        assert any((r["from_release"], r["to_release"]) == (a, b) for r in rows), (a, b)


def test_every_row_is_classified():
    """Every behavioural change on the input path has a kind: none is left unreviewed."""
    unreviewed = [(r["from_release"], r["to_release"], r["file"])
                  for r in _rows() if r["kind"] == "unreviewed"]
    assert not unreviewed, unreviewed


def test_known_findings_named_exist_and_cover_the_buggy_releases():
    """A fix's findings apply before the fix and not at it; a regression's at it."""
    entries = _known_entries()
    for r in _rows():
        for name in filter(None, r["known_finding"].split(";")):
            assert name in entries, name
            if r["kind"] not in ("bug_fix", "regression") or "#" not in name:
                continue
            versions = entries[name]["vllm"]
            if r["kind"] == "bug_fix":
                assert in_range(r["from_release"], versions), (name, versions)
                assert not in_range(r["to_release"], versions), (name, versions)
            else:
                assert in_range(r["to_release"], versions) and not in_range(r["from_release"], versions)


def test_reachable_fixes_without_a_known_finding_are_marked():
    """Every bug fix the rig can reach on CPU has a known finding or says what it needs."""
    open_fixes = [r for r in _rows() if r["kind"] in ("bug_fix", "regression")
                  and r["cpu_reachable"] == "yes" and not r["known_finding"]]
    assert all(r["reason"].startswith("NEEDS") for r in open_fixes), open_fixes
    # pinned: no fix waits for a known finding or axis any more (the last, the stale rows a
    # larger batch leaves, has #40-#45 since the rows past the handed ones are observed)
    assert open_fixes == []


def test_the_stale_rows_fix_names_its_known_findings():
    row = next(r for r in _rows() if r["kind"] == "bug_fix" and r["to_release"] == "0.33.0"
               and r["summary"].startswith("gather_block_tables and get_dummy_block_tables also clear"))
    entries = _known_entries()
    names = row["known_finding"].split(";")
    assert len(names) == 6
    for name in names:
        entry = entries[name]
        assert entry["pattern"] == "rows_past_filled" and entry["vllm"] == ">=0.30.0,<=0.32.0"
        assert entry["field"].startswith("attn.filled_rows_past.")


def test_the_sliding_window_fix_names_its_known_findings():
    row = next(r for r in _rows() if r["kind"] == "bug_fix" and r["to_release"] == "0.33.0"
               and r["file"] == GPU + "block_table.py" and r["known_finding"]
               and "window" in r["summary"])
    entries = _known_entries()
    for name in row["known_finding"].split(";"):
        entry = entries[name]
        assert entry["pattern"] == "below_window_kept:window=*" and entry["vllm"] == ">=0.30.0,<=0.32.0"


# ------------------------------------------------------------------ coverage of the sources
def _source(release: str) -> Path | None:
    """A folder holding vllm/ of ``release``: the installed vLLM for its release, else
    SIMRIG_VLLM_SOURCES/<release> (default /tmp/vllm-src/<release>)."""
    from simrig.findings.known import installed_vllm_version

    if release == installed_vllm_version():
        import importlib.util

        spec = importlib.util.find_spec("vllm")
        if spec is not None and spec.submodule_search_locations:
            return Path(list(spec.submodule_search_locations)[0]).parent
    root = Path(os.environ.get("SIMRIG_VLLM_SOURCES", "/tmp/vllm-src")) / release
    return root if (root / GPU).is_dir() else None


def _files(root: Path) -> dict[str, Path]:
    base = root / GPU
    return {GPU + p.relative_to(base).as_posix(): p for p in base.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".md")}


def changed_files(old: Path, new: Path) -> set[str]:
    """Files under vllm/v1/worker/gpu/ whose content differs (or exist on one side)."""
    a, b = _files(old), _files(new)
    out = {f for f in a.keys() & b.keys() if not filecmp.cmp(a[f], b[f], shallow=False)}
    return out | (a.keys() ^ b.keys())


def _covers(rows: list[dict[str, str]], step: tuple[str, str], path: str) -> bool:
    files = {r["file"] for r in rows if (r["from_release"], r["to_release"]) == step}
    return path in files or any(f.endswith("/") and path.startswith(f) for f in files)


def test_changed_files_are_detected_in_a_small_tree(tmp_path):
    for side, text in (("old", "a = 1\n"), ("new", "a = 2\n")):
        (tmp_path / side / GPU).mkdir(parents=True)
        (tmp_path / side / GPU / "x.py").write_text(text)
        (tmp_path / side / GPU / "same.py").write_text("same\n")
    (tmp_path / "new" / GPU / "added.py").write_text("\n")
    assert changed_files(tmp_path / "old", tmp_path / "new") == {GPU + "x.py", GPU + "added.py"}
    rows = [{"from_release": "0.30.0", "to_release": "0.31.0", "file": GPU + "spec_decode/"}]
    assert _covers(rows, ("0.30.0", "0.31.0"), GPU + "spec_decode/ngram/x.py")
    assert not _covers(rows, ("0.30.0", "0.31.0"), GPU + "x.py")


@pytest.mark.parametrize("step", STEPS, ids=lambda s: "->".join(s))
def test_every_changed_file_of_the_input_path_has_a_row(step):
    old, new = _source(step[0]), _source(step[1])
    if old is None or new is None:
        pytest.skip(f"sources of {step[0]} and {step[1]} not both present (SIMRIG_VLLM_SOURCES)")
    rows = _rows()
    missing = sorted(f for f in changed_files(old, new) if not _covers(rows, step, f))
    assert not missing, f"{step[0]} -> {step[1]}: changed files without a row in history.csv: {missing}"
