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
