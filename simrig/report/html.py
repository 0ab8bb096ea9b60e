"""The self-contained HTML page of a report, opening at the verdict.

Every report (replay, fuzz, selftest) reads in the same order, one section after another;
``render_html`` builds them as a list (its docstring draws the page). Everything is inline
(CSS, PNG as data URIs): the file opens anywhere. See docs/reports.md.
"""

from __future__ import annotations

import base64
import html
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.findings.classes import verdict_line
from simrig.views.sections import Links, changes_section, folded_classes_section, new_classes_section

HTML_ROWS = 200  # rows per table shown in the HTML (the files hold all)
OCCURRENCES_SHOWN = 50  # occurrence rows under each class
OCCURRENCE_COLUMNS = ("trace", "pcp_size", "step", "stage", "rank", "check", "req_ids", "expected",
                      "actual", "message")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1em auto;max-width:1280px;
color:#222;padding:0 1em}
h1{font-size:1.35em;margin:.2em 0}h2{font-size:1.1em;margin:1em 0 .3em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin:.8em 0 .2em}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}
.banner{font-size:1.15em;padding:.5em .8em;border-radius:4px;margin:.4em 0}
.banner.bad{background:#fde8e8;color:#900}.banner.good{background:#e6f4ea;color:#065}
.facts{color:#444;font-size:13px;margin:.2em 0 .8em}
.new{color:#b00;font-weight:bold}.known{color:#777}.expected{color:#065}
.note{color:#666;font-size:12px}img{max-width:100%}
td.msg{max-width:420px;word-break:break-word}code{font-size:11px;word-break:break-all}
td.cls{max-width:380px}td.why{min-width:260px;max-width:460px}
details>summary{cursor:pointer;color:#345}tr.occ>td{border-top:none;background:#fbfbfb}
.card{border-left:4px solid #b00;background:#fff8f8;padding:.35em .7em;margin:.35em 0;font-size:13px}
.card .msg1{color:#333;font-size:12px;margin:.1em 0}.card div{margin:.1em 0}
code.cmd{font-size:12px;background:#f2f2f2;padding:1px 4px;word-break:break-all}
ul.changes{margin:.2em 0;padding-left:1.3em;font-size:13px}
table.oneline td{white-space:nowrap}
"""


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def emit_json(summary: dict[str, Any]) -> None:
    """``--json``: the summary on stdout, nothing else there."""
    sys.stdout.write(json.dumps(jsonable(summary), indent=2, sort_keys=True) + "\n")


def banner(summary: dict[str, Any]) -> tuple[str, bool]:
    """(text, bad) from the class verdict counts summary.json carries."""
    counts = summary.get("classes") or {}
    text = verdict_line(counts)
    extra = summary.get("verdict_note")
    if extra:
        text += f"; {extra}"
    status = summary.get("exit_status")
    if status is not None:
        text += f" — exit {status}"
    bad = bool(counts.get("new")) or bool(status)
    return text, bad


def render_html(title: str, summary: dict[str, Any], steps: pd.DataFrame, findings: pd.DataFrame,
                contract: pd.DataFrame, extra_tables: dict[str, pd.DataFrame], *,
                classes: pd.DataFrame | None = None, occurrences: pd.DataFrame | None = None,
                headline: str = "", page_dir: Path | None = None,
                extra_sections: Sequence[str] = ()) -> str:
    """The page, as a list of sections in reading order (see the module docstring);
    ``extra_sections`` (HTML) go after the folded classes, before the evidence tables.
    ``page_dir``: where the page will live, for its links into the checkout.

    Every report (replay, fuzz, selftest) reads in the same order, one section after another
    (``render_html`` builds them as a list):

        ┌──────────────────────────────────────────────────────────────────┐
        │ title                                                            │
        │ VERDICT  1 new finding class (5 known, 0 expected) — exit 1      │  verdict_section
        │ one line of facts: steps, steps/s, vLLM, device, memcheck on/off │
        │ New classes: one card each: signature, what went wrong,          │  sections.new_classes_section
        │   `simrig replay ...` and `simrig repro ...`, ▸ occurrences      │
        │ Since the previous run: new / gone classes, rates, coverage      │  sections.changes_section
        │ Plots: coverage and classes over time (campaigns), batch         │  plots_section
        │   composition, stage latency, where the time goes               │
        │ ▸ Known and expected classes: one line each, entry, links        │  sections.folded_classes_section
        │ coverage, extra tables, ▸ dtype contract, ▸ summary.json         │  evidence_sections
        └──────────────────────────────────────────────────────────────────┘

    Everything is inline (CSS, PNG as data URIs): the file opens anywhere.
    """
    classes = classes if classes is not None else pd.DataFrame()
    occurrences = occurrences if occurrences is not None else findings
    sections = [
        verdict_section(title, summary, headline),
        new_classes_section(classes, lambda c: occurrences_html(c, occurrences)),
        changes_section(summary.get("since_previous")),
        plots_section(summary, steps, classes, extra_tables),
        folded_classes_section(classes, Links(page_dir)),
        *extra_sections,
        *evidence_sections(summary, contract, extra_tables),
    ]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(s for s in sections if s)
            + "\n</body></html>")


def verdict_section(title: str, summary: dict[str, Any], headline: str) -> str:
    e = html.escape
    text, bad = banner(summary)
    if isinstance(summary.get("memcheck"), bool):  # replay, fuzz, selftest: as it ran, not as asked
        headline += ("; " if headline else "") + f"memcheck {'on' if summary['memcheck'] else 'off'}"
    patches = summary.get("interpreter_patches")
    patch_line = (f"<p class='facts'>interpreter patches: {e(str(patches['line']))}</p>"
                  if isinstance(patches, dict) and patches.get("line") else "")
    return (f"<h1>{e(title)}</h1><p class='banner {'bad' if bad else 'good'}'>{e(text)}</p>"
            + (f"<p class='facts'>{e(headline)}</p>" if headline else "") + patch_line)


def plots_section(summary: dict[str, Any], steps: pd.DataFrame, classes: pd.DataFrame,
                  extra_tables: dict[str, pd.DataFrame]) -> str:
    """A campaign's curves over time, the batch composition, the stage latency, the time share."""
    # lazy: report.plots and views.trends bring matplotlib, needed only here
    from simrig.report import plots
    from simrig.views import trends

    e = html.escape
    # a campaign's classes over its seconds (a selftest's classes carry seconds to detection,
    # another clock: not drawn as one)
    campaign = summary.get("command") == "fuzz" and len(classes)
    pngs = [("Over the campaign", trends.campaign_curves(
                extra_tables.get("coverage_timeline"), classes if campaign else None)),
            ("Batch composition", plots.batch_composition(steps)),
            ("Stage latency", plots.stage_latency(steps))]
    parts = []
    for caption, png in pngs:
        if png is not None:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<h3>{e(caption)}</h3><img alt='{e(caption)}' "
                         f"src='data:image/png;base64,{data}'>")
    share = summary.get("time_share")
    if isinstance(share, dict) and share.get("wall_s"):
        parts.append("<h3>Where the time goes</h3>" + time_table(share))
    return "<section id='plots'><h2>Plots</h2>" + "".join(parts) + "</section>" if parts else ""


def evidence_sections(summary: dict[str, Any], contract: pd.DataFrame,
                      extra_tables: dict[str, pd.DataFrame]) -> list[str]:
    """Below the classes: coverage, the extra tables, the dtype contract, summary.json."""
    e = html.escape
    parts = []
    if "axes" in extra_tables:  # what the campaign reached: a clean verdict covers only these
        parts.append("<h2>Request features drawn</h2><p class='note'>Per axis, when the campaign first "
                     "drew it (seconds into the campaign) and how often; \"never\": not reached.</p>"
                     + table(extra_tables["axes"], limit=HTML_ROWS))
    if "coverage_functions" in extra_tables:
        parts.append(coverage_section(summary.get("coverage") or {}, extra_tables))
    for name, frame in extra_tables.items():
        if name in ("occurrences", "axes") or name.startswith("coverage_"):
            continue  # shown under each class / in the coverage section
        parts.append(f"<h2>{e(name)}</h2>" + table(frame, limit=HTML_ROWS))
    if not contract.empty:
        parts.append("<h2>Observed dtype contract</h2><details><summary>"
                     f"{len(contract):,} (stage, field, dtype) rows</summary>"
                     + table(contract, limit=HTML_ROWS) + "</details>")
    parts.append("<h2>Full summary</h2><details><summary>summary.json</summary>"
                 f"<pre>{e(json.dumps(jsonable(summary), indent=1, sort_keys=True))}</pre></details>")
    parts.append("<p class='note'>Tables: classes, findings, steps, contract (.parquet, .csv) "
                 "next to this file.</p>")
    return parts


def occurrences_html(c: Any, occurrences: pd.DataFrame) -> str:
    """A class's occurrence rows, collapsed ("" when the table holds none)."""
    occ = _occurrences_of(c, occurrences)
    if occ is None or not len(occ):
        return ""
    cols = [col for col in OCCURRENCE_COLUMNS if col in occ.columns]
    return (f"<details><summary>{len(occ):,} occurrence row(s)</summary>"
            + table(occ[cols], limit=OCCURRENCES_SHOWN) + "</details>")


def _occurrences_of(c: Any, occurrences: pd.DataFrame) -> pd.DataFrame | None:
    needed = {"kind", "stage", "field", "exception_type"}
    if occurrences is None or occurrences.empty or not needed <= set(occurrences.columns):
        return None
    mask = ((occurrences["kind"].astype(str) == c.kind) & (occurrences["stage"].astype(str) == c.stage)
            & (occurrences["field"].astype(str) == c.field)
            & (occurrences["exception_type"].astype(str) == c.exception_type))
    if "verdict" in occurrences.columns:
        mask &= occurrences["verdict"].astype(str) == c.verdict
    return occurrences[mask]


def coverage_section(cov: dict[str, Any], tables: dict[str, pd.DataFrame]) -> str:
    """Where the run looked: per file, per driven function, and the source of every
    never-reached line of a driven function with its reason (or none: unexplained)."""
    e = html.escape

    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{v:.1f}%"

    unexplained = int(cov.get("unexplained_lines", 0) or 0)
    parts = ["<h2>Coverage of the MRV2 code</h2>",
             (f"<p class='banner {'bad' if unexplained else 'good'}'>"
              f"{e(pct(cov.get('lines_pct')))} of lines ({cov.get('lines_reached', 0):,} of "
              f"{cov.get('lines', 0):,}) and {e(pct(cov.get('branches_pct')))} of branches "
              f"({cov.get('branches_reached', 0):,} of {cov.get('branches', 0):,}) in "
              f"{cov.get('driven_functions', 0)} driven functions; {cov.get('unreached_lines', 0)} "
              f"never-reached lines, {unexplained} without a reason (unexplained_coverage)</p>"),
             ("<p class='note'>A function is driven when the run reached a line of it. Reasons come "
              f"from {e(str(cov.get('reasons_file', '')))}; tracer: {e(str(cov.get('tracer', '')))}.</p>")]
    unreached = tables.get("coverage_unreached")
    if unreached is not None and len(unreached):
        shown = unreached.sort_values(["explained", "file", "line"])
        cols = ["file", "function", "line", "source", "reason", "category"]
        parts.append(f"<h3>Never-reached lines of driven functions</h3><details{' open' if unexplained else ''}>"
                     f"<summary>{len(unreached):,} lines ({unexplained} unexplained first)</summary>"
                     + table(shown[cols], limit=HTML_ROWS) + "</details>")
    parts.append("<h3>Per function</h3><details><summary>"
                 f"{len(tables['coverage_functions']):,} driven functions</summary>"
                 + table(tables["coverage_functions"], limit=HTML_ROWS) + "</details>")
    if "coverage_files" in tables:
        parts.append("<h3>Per file</h3>" + table(tables["coverage_files"], limit=HTML_ROWS))
    return "\n".join(parts)


def time_table(share: dict[str, Any]) -> str:
    rows = [("vLLM calls (all stages)", share["vllm_s"], share["vllm_share"])]
    rows += [(f"  {stage}" if stage != "unstaged" else "  unstaged (prepare_attn kernels, glue, startup)",
              v["s"], v["share"]) for stage, v in share.get("stages", {}).items()]
    rows.append(("rig (generation, checks, bookkeeping)", share["rig_s"], share["rig_share"]))
    body = "".join(f"<tr><td>{html.escape(name)}</td><td>{s:,.3f}</td><td>{frac:.1%}</td></tr>"
                   for name, s, frac in rows)
    return (f"<table><tr><th>where</th><th>seconds</th><th>share of {share['wall_s']:,.1f} s</th></tr>"
            f"{body}</table>")


def table(frame: pd.DataFrame, limit: int | None = None) -> str:
    if frame.empty:
        return "<p class='note'>(empty)</p>"
    shown = frame if limit is None else frame.head(limit)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    verdict_col = list(shown.columns).index("verdict") if "verdict" in shown.columns else -1
    body = []
    for row in shown.itertuples(index=False):
        cells = []
        for i, value in enumerate(row):
            text = html.escape(str(value))
            if i == verdict_col:
                cells.append(f"<td class='{text}'>{text}</td>")
            else:
                cells.append(f"<td class='msg'>{text}</td>" if len(text) > 40 else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = (f"<p class='note'>first {limit} of {len(frame):,} rows</p>"
            if limit is not None and len(frame) > limit else "")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{note}"
