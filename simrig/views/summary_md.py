"""``--summary-md FILE``: a report in a few Markdown lines, for a CI job page.

``summary_markdown`` writes the headline (alone, the status a chat message needs), the
facts line, the new classes with how to reproduce each, what changed since the
previous run, and the report's path. A CI job appends the file to its job page.

See docs/reports.md, 'A summary for a CI job page' for an example.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from simrig.views.changes_text import change_lines, previous_label

MAX_NEW = 20  # new classes listed (the report has them all)
MESSAGE_CHARS = 200


def summary_markdown(command: str, verdict: str, headline: str, summary: dict[str, Any],
                     classes: pd.DataFrame | None, report: str) -> str:
    """The Markdown summary of one run: ``verdict`` is the banner's text, ``headline``
    the facts line, ``summary`` the report's summary.json (its ``since_previous``)."""
    lines = [f"### simrig {command}: {_flat(verdict)}"]
    if headline:
        lines.append(_flat(headline))
    new = classes[classes["verdict"] == "new"] if classes is not None and len(classes) else None
    if new is not None and len(new):
        lines += ["", "**New classes**"]
        for c in new.head(MAX_NEW).itertuples(index=False):
            where = str(c.first_trace).rsplit("/", 1)[-1]
            first = f", first at {where} step {c.first_step}" if where else ""
            message = _flat(str(c.message))
            if len(message) > MESSAGE_CHARS:
                message = message[:MESSAGE_CHARS - 1] + "…"
            lines.append(f"- `{c.signature}` ({c.occurrences:,} occurrences{first}): {_md(message)}")
            if c.reproduce:
                lines.append(f"  - reproduce: `{c.reproduce}`")
            if getattr(c, "repro_pytest", ""):
                lines.append(f"  - pytest file for vLLM: `{c.repro_pytest}`")
        if len(new) > MAX_NEW:
            lines.append(f"- ... and {len(new) - MAX_NEW} more in the report")
    changes = summary.get("since_previous")
    if isinstance(changes, dict):
        label = previous_label(changes)
        lines += ["", "**Since the previous run**" + (f" ({label})" if label else "")]
        lines += [f"- {_md(line)}" for line in change_lines(changes)]
        appeared = [a for a in changes.get("appeared") or [] if a.get("verdict") == "new"]
        if appeared:
            lines.append("- failing since then: " + ", ".join(f"`{a['signature']}`" for a in appeared[:10]))
        gone = changes.get("gone") or []
        if gone:
            lines.append("- gone: " + ", ".join(f"`{g['signature']}` ({g['why']})" for g in gone[:10]))
    lines += ["", f"Report: `{report}`", ""]
    return "\n".join(lines)


def _flat(text: str) -> str:
    return " ".join(str(text).split())


def _md(text: str) -> str:
    """Plain text that Markdown shows as written (no emphasis, no HTML)."""
    for ch in ("\\", "*", "_", "<", ">", "`", "|"):
        text = text.replace(ch, "\\" + ch)
    return text
