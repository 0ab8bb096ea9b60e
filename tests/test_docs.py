"""The documentation: the site builds strictly, generated tables are current, the README
stays short and its links resolve.

mkdocs and mkdocs-material are the project's `docs` extra (scripts/bootstrap.sh installs
it), so nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from simrig.report.docs_tables import known_findings_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 300


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link, a missing page or a page left out of the nav fails."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "known-findings.html").is_file()


def _table_after(text: str, header: str) -> str:
    lines = text.splitlines()
    start = lines.index(header)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


def test_the_known_findings_page_holds_exactly_the_generated_table():
    generated = known_findings_table()
    page = (ROOT / "docs" / "known-findings.md").read_text(encoding="utf-8")
    assert _table_after(page, generated.splitlines()[0]) == generated, (
        "docs/known-findings.md's table differs from simrig.report.docs_tables.known_findings_table()")


def test_the_known_findings_table_lists_every_entry():
    entries = sum(len(json.loads(p.read_text())["findings"])
                  for p in (ROOT / "reports" / "baselines").glob("known-findings*.json"))
    assert len(known_findings_table().splitlines()) == 2 + entries


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_every_relative_link_of_the_readme_resolves():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]
    assert relative, "the README links into docs/"
    missing = [t for t in relative if not (ROOT / t.split("#")[0]).exists()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"


def _generated_tables_on(page: str, generated: str) -> None:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    for table in generated.split("\n\n"):
        assert _table_after(text, table.splitlines()[0]) == table, (
            f"docs/{page}'s table differs from its generator in simrig.report.docs_tables")


def test_the_release_differences_page_holds_exactly_the_generated_table():
    from simrig.report.docs_tables import release_differences_table

    _generated_tables_on("release-differences.md", release_differences_table())


def test_the_history_page_holds_exactly_the_generated_tables():
    from simrig.report.docs_tables import history_table

    generated = history_table()
    assert generated.count("\n\n") == 1  # the fixes, then the counts
    _generated_tables_on("vllm-history.md", generated)
