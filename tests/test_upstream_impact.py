"""Every reports/upstream/ folder says what a vLLM user sees, and its title's tag follows.

An ISSUE.md has an ``## Impact`` section whose first line is
``**Visible to users: yes|no — <what>**``; the title is ``# [Bug]...`` exactly where the
answer is yes and ``# [Misc]...`` where it is no; the section cites vLLM's code (a file:line)
and the line's text (a code span). The rule is read here from the text alone, not through
``simrig.repro.impact``, so a generator that drifts from it fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from simrig.bisect.search import ClassKey
from simrig.errors import UsageError
from simrig.repro import impact, upstream

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "reports" / "upstream"
FIRST = re.compile(r"^\*\*Visible to users: (yes|no) — ([^*]{10,})\*\*$")
PLACEHOLDER = re.compile(r"\b(TODO|TBD|FIXME|fill in|placeholder)\b", re.I)


def impact_problems(text: str) -> list[str]:
    """What is wrong with an ISSUE.md's Impact section and title tag (empty when right)."""
    lines = text.splitlines()
    if "## Impact" not in lines:
        return ["no '## Impact' section"]
    start = lines.index("## Impact") + 1
    body = []
    for line in lines[start:]:
        if line.startswith("## "):
            break
        body.append(line)
    content = [line for line in body if line.strip()]
    if not content:
        return ["the Impact section is empty"]
    match = FIRST.match(content[0])
    if match is None:
        return [f"the Impact section's first line is not '**Visible to users: yes|no — ...**': "
                f"{content[0][:80]!r}"]
    problems = []
    want = "[Bug]" if match.group(1) == "yes" else "[Misc]"
    title = lines[0] if lines else ""
    got = re.match(r"^# (\[\w+\])", title)
    if got is None or got.group(1) != want:
        problems.append(f"visible to users: {match.group(1)}, so the title's tag is {want}; "
                        f"the title reads {title[:60]!r}")
    rest = " ".join(content[1:])
    if not re.search(r"vllm/[\w/]+\.py:\d+", rest):
        problems.append("the Impact section cites no vLLM file:line")
    if "`" not in rest:
        problems.append("the Impact section quotes no line of vLLM (no code span)")
    if PLACEHOLDER.search(" ".join(content)):
        problems.append("the Impact section is a placeholder")
    return problems


def _folders() -> list[Path]:
    return sorted(p for p in UPSTREAM.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.name)
def test_a_folder_has_an_impact_section_and_the_tag_it_earns(folder):
    problems = impact_problems((folder / "ISSUE.md").read_text())
    assert not problems, f"{folder.name}/ISSUE.md: " + "; ".join(problems)


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.name)
def test_a_folders_issue_is_what_upstream_writes(folder):
    """The Impact text lives in simrig/repro/impact.py; the folder holds what it renders."""
    verdict = json.loads((folder / "verdict.json").read_text())
    key = ClassKey(*verdict["class"].split(":", 3))
    text = upstream.issue_text(upstream.FINDINGS[key.text], key, folder / "trace.jsonl",
                               folder / verdict["test"])
    assert (folder / "ISSUE.md").read_text() == text, (
        f"{folder.name}/ISSUE.md differs from what `simrig repro --upstream` writes: "
        "regenerate it with simrig repro TRACE --class CLASS --upstream FOLDER")


@pytest.mark.parametrize("cls", sorted(upstream.FINDINGS))
def test_upstream_writes_no_folder_this_test_rejects(cls, tmp_path):
    """Every class --upstream accepts has its impact, and its ISSUE.md passes the rule."""
    assert cls in impact.IMPACT, f"{cls}: no entry in simrig/repro/impact.py IMPACT"
    folder = next((f for f in _folders() if json.loads((f / "verdict.json").read_text())["class"] == cls),
                  None)
    assert folder is not None, f"{cls}: no reports/upstream/ folder to render its schedule from"
    key = ClassKey(*cls.split(":", 3))
    text = upstream.issue_text(upstream.FINDINGS[cls], key, folder / "trace.jsonl", tmp_path / "test_x.py")
    assert not impact_problems(text), impact_problems(text)


def test_upstream_refuses_a_class_without_an_impact(tmp_path, monkeypatch):
    folder = _folders()[0]
    cls = json.loads((folder / "verdict.json").read_text())["class"]
    monkeypatch.delitem(impact.IMPACT, cls)
    with pytest.raises(UsageError, match="no impact entry"):
        upstream.write_folder(tmp_path / "f", folder / "trace.jsonl", ClassKey(*cls.split(":", 3)), "")
    assert not (tmp_path / "f" / "ISSUE.md").exists()


def test_the_rule_rejects_a_wrong_tag_a_missing_section_and_a_placeholder():
    good = ("# [Misc][MRV2] t\n\n## Impact\n\n**Visible to users: no — nothing reaches an output**\n\n"
            "`vllm/v1/worker/gpu/x.py:1`, `f`: `a = b`.\n\n## Minimal schedule\n")
    assert impact_problems(good) == []
    assert "title's tag is [Misc]" in impact_problems(good.replace("[Misc]", "[Bug]"))[0]
    assert "title's tag is [Bug]" in impact_problems(good.replace("no —", "yes —"))[0]
    assert impact_problems(good.replace("## Impact", "## Effect")) == ["no '## Impact' section"]
    assert "first line" in impact_problems(good.replace("**Visible to users: no", "Visible: no"))[0]
    assert impact_problems(good.replace("a = b", "TODO")) == ["the Impact section is a placeholder"]
    assert impact_problems(good.replace("vllm/v1/worker/gpu/x.py:1", "x")) == [
        "the Impact section cites no vLLM file:line"]


# `vllm/<file>.py:N[-M]`, `function` (optional note): `the line's text` (``...`` elides)
CITE = re.compile(r"`?(vllm/[\w/]+\.py):(\d+)(?:-(\d+))?`?,? `([\w.]+)`(?: \([^)]*\))?: `([^`]+)`")
CITED_RELEASE = "0.33.0"


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text).replace(",)", ")").replace(",}", "}")


def cite_problem(root: Path, path: str, first: int, last: int, function: str, quoted: str) -> str | None:
    """None when ``path`` lines first..last lie in ``function`` and hold ``quoted`` (its
    fragments between '...', in order, whitespace aside); else what is wrong."""
    import ast

    file = root / path.removeprefix("vllm/")
    if not file.is_file():
        return f"{path}: no such file in vLLM {CITED_RELEASE}"
    lines = file.read_text().splitlines()
    enclosing = {node.name for node in ast.walk(ast.parse("\n".join(lines)))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.lineno <= first <= (node.end_lineno or node.lineno)}
    if function.rsplit(".", 1)[-1] not in enclosing:
        return f"{path}:{first} is not in {function} (in {sorted(enclosing)})"
    text, at = _squash(" ".join(lines[first - 1:last])), 0
    for fragment in (_squash(f).strip(",") for f in quoted.split("...")):
        found = text.find(fragment, at)
        if fragment and found < 0:
            return f"{path}:{first}-{last} does not hold {fragment!r}"
        at = max(at, found + len(fragment))
    return None


def test_every_line_an_impact_cites_says_so():
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vllm is not installed"
    root = Path(list(spec.submodule_search_locations)[0])
    version = re.search(r"version = '([^']+)'", (root / "_version.py").read_text())
    if version is None or version.group(1) != CITED_RELEASE:
        installed = version.group(1) if version else "unknown"
        pytest.skip(f"the Impact sections cite vLLM {CITED_RELEASE}; installed: {installed}")
    problems, cited = [], 0
    for cls, entry in impact.IMPACT.items():
        for path, first, last, function, quoted in CITE.findall(entry.how):
            cited += 1
            problem = cite_problem(root, path, int(first), int(last or first), function, quoted)
            if problem:
                problems.append(f"{cls}: {problem}")
        assert CITE.search(entry.how), f"{cls}: the Impact cites no `file:line`, `function`: `line`"
    assert not problems, "\n".join(problems)
    assert cited >= len(impact.IMPACT)


def test_the_cite_check_names_a_wrong_line(tmp_path):
    (tmp_path / "m.py").write_text("def f(a):\n    x = g(\n        a,\n    )\n    return x\n")
    assert cite_problem(tmp_path, "vllm/m.py", 2, 4, "f", "x = g(a)") is None
    assert cite_problem(tmp_path, "vllm/m.py", 2, 4, "f", "x = g(..., a)") is None
    assert "does not hold" in cite_problem(tmp_path, "vllm/m.py", 2, 4, "f", "x = h(a)")
    assert "is not in" in cite_problem(tmp_path, "vllm/m.py", 2, 4, "other", "x = g(a)")
    assert "no such file" in cite_problem(tmp_path, "vllm/n.py", 1, 1, "f", "x")
