"""Tables of the documentation site (docs/) that are generated, not written by hand.

    known_findings_table()        docs/known-findings.md: one row per entry of the committed
                                  reports/baselines/known-findings*.json
    release_differences_table()   docs/release-differences.md: reports/baselines/release-differences.json
    history_table()               docs/vllm-history.md: reports/baselines/history.csv
    floors_table()                docs/layout.md: simrig.layout.FLOORS, between FLOORS_BEGIN
                                  and FLOORS_END (tests/test_layout.py)

tests/test_docs.py fails when a page's table differs from the function's output, so a
new or changed entry cannot leave the documentation stale. (The oracle page's table of
fields with no value expectation is ``simrig.ledger.unchecked.readme_table()``.)

Pure Python: reads the JSON files, never imports vLLM.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from simrig.layout import FLOORS

BASELINES = Path(__file__).resolve().parents[2] / "reports" / "baselines"

# The optional keys of an entry that narrow its signature (simrig/findings/known.py).
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
    ``folder`` (default the committed ``reports/baselines/``), in file and entry order. Each row
    carries its entry's anchor (``simrig.views.sections.entry_anchor``): a report's known
    class links to it."""
    from simrig.views.sections import entry_anchor  # lazy: views.sections brings pandas, needed only here

    folder = BASELINES if folder is None else Path(folder)
    rows = ["| entry | kind · stage · field | check | releases | signature | explanation |",
            "|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("known-findings*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        default = f"=={data.get('vllm_version', '?')}"
        for i, entry in enumerate(data.get("findings", [])):
            key = " · ".join(str(entry.get(k) or "–") for k in ("kind", "stage", "field"))
            name = f"{path.name}#{i}"
            rows.append(f"| <a id=\"{entry_anchor(name)}\"></a>`{name}` | {_cell(key)} | `{_cell(entry.get('check', '–'))}` "
                        f"| `{_cell(entry.get('vllm', default))}` | {_signature(entry)} "
                        f"| {_cell(entry.get('explanation', ''))} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- release differences
def release_differences_table(path: Path | None = None) -> str:
    """docs/release-differences.md's table: every accepted difference of
    ``reports/baselines/release-differences.json``, with its branches and evidence."""
    path = BASELINES / "release-differences.json" if path is None else Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = ["| difference | kind | releases | branches in the oracle | evidence in vLLM | why not a bug |",
            "|---|---|---|---|---|---|"]
    for entry in data["differences"]:
        branches = "; ".join(f"`{b['module']}.{b['function']}` ({b['marker']})" for b in entry["branches"])
        evidence = "; ".join(f"`{e['file']}:{e['line']}` ({e['release']}): `{e['text']}`"
                             for e in entry.get("evidence", ())) or "–"
        rows.append(f"| **{_cell(entry['id'])}**: {_cell(entry['summary'])} | `{entry['kind']}` "
                    f"| {_cell(entry['releases'])} | {_cell(branches)} | {_cell(evidence)} "
                    f"| {_cell(entry['why_not_a_bug'])} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- vLLM's history
HISTORY_COLUMNS = ("from_release", "to_release", "file", "lines", "kind", "summary", "commit", "pr",
                   "cpu_reachable", "known_finding", "reason")
HISTORY_KINDS = ("bug_fix", "regression", "feature", "refactor", "api_change", "unreviewed",
                 "outside_input_path")


def read_history(path: Path | None = None) -> list[dict[str, str]]:
    """The rows of ``reports/baselines/history.csv``."""
    path = BASELINES / "history.csv" if path is None else Path(path)
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def history_table(path: Path | None = None) -> str:
    """docs/vllm-history.md's tables: the bugs fixed or introduced between releases (with
    whether the rig can reach them without a GPU and the known findings that hold them),
    then the count of every row by release step and kind."""
    rows = read_history(path)
    out = ["| releases | file | lines | kind | change | without a GPU | known finding | note |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] in ("bug_fix", "regression"):
            known = ", ".join(f"`{k}`" for k in r["known_finding"].split(";") if k) or "–"
            out.append(f"| {r['from_release']} → {r['to_release']} | `{_cell(r['file'])}` | {_cell(r['lines']) or '–'} "
                       f"| {r['kind']} | {_cell(r['summary'])} | {r['cpu_reachable'] or '?'} | {known} "
                       f"| {_cell(r['reason']) or '–'} |")
    out += ["", "| releases | " + " | ".join(HISTORY_KINDS) + " |", "|---|" + "---|" * len(HISTORY_KINDS)]
    steps = sorted({(r["from_release"], r["to_release"]) for r in rows})
    for a, b in steps:
        counts = [sum(1 for r in rows if (r["from_release"], r["to_release"], r["kind"]) == (a, b, k))
                  for k in HISTORY_KINDS]
        out.append(f"| {a} → {b} | " + " | ".join(str(c) for c in counts) + " |")
    return "\n".join(out)


FLOORS_BEGIN, FLOORS_END = "<!-- floors:begin -->", "<!-- floors:end -->"


def floors_table() -> str:
    """docs/layout.md's *Floors* table: one row per floor of ``simrig.layout.FLOORS``, the
    highest first; a floor's units in the order the layout lists them (top-level modules by
    name, ``__init__`` first)."""
    rows = ["| floor | units |", "|---|---|"]
    for number in range(len(FLOORS) - 1, -1, -1):
        units = sorted(FLOORS[number], key=lambda u: (u != "__init__", u))
        shown = [u for u in units if u != "__init__"]  # the package itself imports nothing
        rows.append(f"| {number} | {', '.join(f'`{u}`' for u in shown)} |")
    return "\n".join(rows)


def generated_section(text: str, begin: str, end: str) -> str:
    """The generated part of a page: between ``begin`` and ``end`` (empty when a marker is missing)."""
    if begin not in text or end not in text:
        return ""
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def with_section(text: str, begin: str, end: str, table: str) -> str:
    """``text`` with its generated part replaced by ``table`` (how a page is regenerated)."""
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}"
