"""Tables of the documentation site (docs/) that are generated, not written by hand.

    known_findings_table()   docs/known-findings.md: one row per entry of the committed
                             reports/baselines/known-findings*.json

tests/test_docs.py fails when a page's table differs from the function's output, so a
new or changed entry cannot leave the documentation stale. (The oracle page's table of
fields with no value expectation is ``simrig.checks.unchecked.readme_table()``.)

Pure Python: reads the JSON files, never imports vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASELINES = Path(__file__).resolve().parents[2] / "reports" / "baselines"

# The optional keys of an entry that narrow its signature (simrig/checks/known.py).
_SIGNATURE_KEYS = ("expected", "actual", "pattern")


def _cell(text: object) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _signature(entry: dict[str, Any]) -> str:
    parts = [f"{key} `{entry[key]}`" for key in _SIGNATURE_KEYS if entry.get(key) is not None]
    for key, clause in sorted((entry.get("when") or {}).items()):
        parts.append(f"`{key}{clause}`")
    return "; ".join(_cell(p) for p in parts) or "–"


def known_findings_table(folder: Path | None = None) -> str:
    """docs/known-findings.md's table: every entry of every ``known-findings*.json`` in
    ``folder`` (default the committed ``reports/baselines/``), in file and entry order."""
    folder = BASELINES if folder is None else Path(folder)
    rows = ["| entry | kind · stage · field | check | releases | signature | explanation |",
            "|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("known-findings*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        default = f"=={data.get('vllm_version', '?')}"
        for i, entry in enumerate(data.get("findings", [])):
            key = " · ".join(str(entry.get(k) or "–") for k in ("kind", "stage", "field"))
            rows.append(f"| `{path.name}#{i}` | {_cell(key)} | `{_cell(entry.get('check', '–'))}` "
                        f"| `{_cell(entry.get('vllm', default))}` | {_signature(entry)} "
                        f"| {_cell(entry.get('explanation', ''))} |")
    return "\n".join(rows)
