"""The parts of a report page that answer a nightly owner's questions, in reading order.

    new_classes_section      the classes that fail the run: signature, one line of what went
                             wrong, the `simrig replay` reproducer and the `simrig repro` command
    changes_section          what changed since the previous run of the same suite
                             (summary["since_previous"], from the history store)
    folded_classes_section   known and expected classes, collapsed, one line each: signature,
                             count, the known-findings entry, links to its explanation in the
                             docs and to its folder under reports/upstream/ (never the text)

``Links`` turns a known-findings entry into those two links, relative to where the page
will live, so a report folder opened in place reaches the checkout's docs and folders.
"""

from __future__ import annotations

import html
import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.views.changes_text import change_lines, previous_label

ROOT = Path(__file__).resolve().parents[2]
DOCS_URL_ENV = "SIMRIG_DOCS_URL"  # a built docs site (URL or folder) to link explanations into
MESSAGE_CHARS = 240  # one line of what went wrong, under a new class

e = html.escape


def entry_anchor(known_by: str) -> str:
    """'known-findings.json#13' -> 'known-findings-json-13': the id of the entry's row in
    docs/known-findings.md (simrig.report.docs_tables.known_findings_table writes it)."""
    return re.sub(r"[^a-z0-9]+", "-", known_by.lower()).strip("-")


@dataclass
class Links:
    """Where a known class's explanation and upstream folder are, seen from ``page_dir``."""

    page_dir: Path | None = None
    root: Path = ROOT
    upstream_dir: Path = field(default_factory=lambda: ROOT / "reports" / "upstream")

    def _href(self, target: Path) -> str:
        if self.page_dir is None:
            return target.resolve().as_uri()
        return os.path.relpath(target.resolve(), Path(self.page_dir).resolve())

    def docs(self, known_by: str) -> str:
        """The entry's row on the Known findings page: SIMRIG_DOCS_URL's site, else the
        built site in the checkout (build/site), else the page's Markdown source."""
        anchor = "#" + entry_anchor(known_by) if known_by else ""
        base = os.environ.get(DOCS_URL_ENV, "").strip()
        if base:
            return base.rstrip("/") + "/known-findings.html" + anchor
        built = self.root / "build" / "site" / "known-findings.html"
        return self._href(built if built.is_file() else self.root / "docs" / "known-findings.md") + anchor

    @cached_property
    def _folders(self) -> list[tuple[str, set[str], str]]:
        """(folder name, known entries, class key) of every reports/upstream/*/verdict.json."""
        out = []
        if self.upstream_dir.is_dir():
            for path in sorted(self.upstream_dir.glob("*/verdict.json")):
                try:
                    verdict = json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue  # a folder being written: no link, never a failed report
                out.append((path.parent.name, set(map(str, verdict.get("known_findings") or ())),
                            str(verdict.get("class", ""))))
        return out

    def upstream(self, known_by: str, kind: str, stage: str, fld: str) -> tuple[str, str] | None:
        """(folder name, link to its ISSUE.md) of the folder written for the known entry (its
        verdict.json lists the entry); a class with no entry recorded: the folder of its key."""
        key = f"{kind}:{stage}:{fld}"
        for by_entry in ((True,) if known_by else (False,)):
            for name, entries, cls in self._folders:
                if (known_by in entries) if by_entry else (cls == key or cls.startswith(key + ":")):
                    return name, self._href(self.upstream_dir / name / "ISSUE.md")
        return None


def _where(trace: str, step: Any, pcp_size: Any) -> str:
    name = str(trace).rsplit("/", 1)[-1]
    text = f"{name} step {step}" if name and str(step) not in ("", "-1") else name
    return text + (f" pcp {pcp_size}" if isinstance(pcp_size, (int, float)) and pcp_size > 1 else "")


def new_classes_section(classes: pd.DataFrame, occurrences_html: Any) -> str:
    """Every class that fails the run, as a card; ``occurrences_html(row)``: its occurrence
    rows, collapsed ("" when none)."""
    new = classes[classes["verdict"] == "new"] if len(classes) else classes
    if not len(new):
        return ("<section id='new-classes'><h2>New classes</h2><p class='expected'>none: no class "
                "fails this run</p></section>")
    cards = []
    for c in new.itertuples(index=False):
        first = _where(c.first_trace, c.first_step, c.first_pcp_size)
        elapsed = getattr(c, "first_elapsed_s", float("nan"))
        if isinstance(elapsed, float) and elapsed == elapsed:
            first += f", {elapsed:.1f} s in"
        message = str(c.message)
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS - 1] + "…"
        lines = [f"<div class='sig'><span class='new'>NEW</span> <b>{e(c.signature)}</b> "
                 f"<span class='note'>checks: {e(c.checks)}</span> · {c.occurrences:,} occurrence(s) "
                 f"in {c.traces} trace(s)" + (f", first at {e(first)}" if first else "") + "</div>",
                 f"<div class='msg1'>{e(message)}</div>"]
        if c.reproduce:
            lines.append(f"<div>reproduce: <code class='cmd'>{e(c.reproduce)}</code></div>")
        if getattr(c, "repro_pytest", ""):
            lines.append(f"<div>pytest file for vLLM: <code class='cmd'>{e(c.repro_pytest)}</code></div>")
        lines.append(occurrences_html(c))
        cards.append("<div class='card'>" + "".join(lines) + "</div>")
    return (f"<section id='new-classes'><h2>New classes ({len(new)})</h2>" + "".join(cards)
            + "</section>")


def changes_section(changes: dict[str, Any] | None) -> str:
    """What changed since the previous run of the suite, in a few lines."""
    if not changes:
        return ""
    label = previous_label(changes)
    items = "".join(f"<li>{e(line)}</li>" for line in change_lines(changes))
    lists = []
    for key, what in (("appeared", "new since then"), ("gone", "gone since then")):
        rows = changes.get(key) or []
        if rows:
            shown = ", ".join(f"<span class='{e(r['verdict'])}'>{e(r['signature'])}</span>"
                              + (f" ({e(r['why'])})" if key == "gone" else f" ({e(r['verdict'])})")
                              for r in rows[:8])
            more = changes.get(f"{key}_count", len(rows)) - min(len(rows), 8)
            lists.append(f"<li>{what}: {shown}{f' and {more} more' if more > 0 else ''}</li>")
    return ("<section id='changes'><h2>Since the previous run</h2>"
            + (f"<p class='note'>{e(label)}</p>" if label else "")
            + f"<ul class='changes'>{items}{''.join(lists)}</ul></section>")


def folded_classes_section(classes: pd.DataFrame, links: Links) -> str:
    """Known and expected classes, one line each, collapsed; the explanation one click away."""
    rest = classes[classes["verdict"] != "new"] if len(classes) else classes
    if not len(rest):
        return ""
    known = int((rest["verdict"] == "known").sum())
    expected = int((rest["verdict"] == "expected").sum())
    rows = []
    for c in rest.itertuples(index=False):
        known_by = str(getattr(c, "known_by", "") or "")
        if c.verdict == "known":
            entry = e(known_by) if known_by else "–"
            why = f"<a href='{e(links.docs(known_by))}'>explanation</a>"
            folder = links.upstream(known_by, c.kind, c.stage, c.field)
            if folder is not None:
                why += f" · <a href='{e(folder[1])}'>reports/upstream/{e(folder[0])}</a>"
        else:
            entry, why = "–", f"<span class='note'>{e(str(c.explanation) or 'declared')}</span>"
        rows.append(f"<tr><td class='{e(c.verdict)}'>{e(c.verdict)}</td><td><b>{e(c.signature)}</b> "
                    f"<span class='note'>checks: {e(c.checks)}</span></td><td>{c.occurrences:,}</td>"
                    f"<td>{entry}</td><td>{why}</td></tr>")
    return ("<section id='known-classes'><h2>Known and expected classes</h2><details><summary>"
            f"{known} known, {expected} expected: one line each (the known-findings entry it "
            "matched; its explanation one click away)</summary><table class='oneline'><tr><th>verdict"
            "</th><th>class</th><th>occurrences</th><th>known entry</th><th>why</th></tr>"
            + "".join(rows) + "</table></details></section>")
