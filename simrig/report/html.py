"""The self-contained HTML page of a report, opening at the verdict.

    ┌──────────────────────────────────────────────────────────────┐
    │ title                                                        │
    │ VERDICT  no new finding classes (2 known, 3 expected) exit 0 │  <- banner (class verdicts)
    │ one line of facts: steps, traces, steps/s, vLLM, device      │
    │ Finding classes: one row per class                           │
    │   ▸ N occurrences (collapsed)                                │
    │ Where the time goes (vLLM calls vs rig, per stage)           │
    │ Plots (summaries), dtype contract (collapsed), extra tables  │
    │ ▸ full summary (collapsed)                                   │
    └──────────────────────────────────────────────────────────────┘

Everything is inline (CSS, PNG as data URIs): the file opens anywhere.
"""

from __future__ import annotations

import base64
import html
import json
import math
from typing import Any

import pandas as pd

HTML_ROWS = 200  # rows per table shown in the HTML (the files hold all)
OCCURRENCES_SHOWN = 50  # occurrence rows under each class
OCCURRENCE_COLUMNS = ("trace", "pcp_size", "step", "stage", "rank", "check", "req_ids", "expected",
                      "actual", "message")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:1em auto;max-width:1280px;
color:#222;padding:0 1em}
h1{font-size:1.35em;margin:.2em 0}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ddd}
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


def banner(summary: dict[str, Any]) -> tuple[str, bool]:
    """(text, bad) from the class verdict counts summary.json carries."""
    from simrig.findings.classes import verdict_line

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
                headline: str = "") -> str:
    from simrig.report import plots

    e = html.escape
    text, bad = banner(summary)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width'><title>{e(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>",
             f"<p class='banner {'bad' if bad else 'good'}'>{e(text)}</p>"]
    if headline:
        parts.append(f"<p class='facts'>{e(headline)}</p>")
    patches = summary.get("interpreter_patches")
    if isinstance(patches, dict) and patches.get("line"):
        parts.append(f"<p class='facts'>interpreter patches: {e(str(patches['line']))}</p>")
    parts.append("<h2>Finding classes</h2>")
    parts.append(class_table(classes if classes is not None else pd.DataFrame(),
                             occurrences if occurrences is not None else findings))
    share = summary.get("time_share")
    if isinstance(share, dict) and share.get("wall_s"):
        parts.append("<h2>Where the time goes</h2>" + time_table(share))
    pngs = [("Batch composition", plots.batch_composition(steps)),
            ("Stage latency", plots.stage_latency(steps))]
    if any(png is not None for _, png in pngs):
        parts.append("<h2>Plots</h2>")
    for caption, png in pngs:
        if png is not None:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<h3>{e(caption)}</h3><img alt='{e(caption)}' "
                         f"src='data:image/png;base64,{data}'>")
    if "coverage_functions" in extra_tables:
        parts.append(coverage_section(summary.get("coverage") or {}, extra_tables))
    for name, frame in extra_tables.items():
        if name == "occurrences" or name.startswith("coverage_"):
            continue  # shown under each class / in the coverage section
        parts.append(f"<h2>{e(name)}</h2>" + table(frame, limit=HTML_ROWS))
    if not contract.empty:
        parts.append("<h2>Observed dtype contract</h2><details><summary>"
                     f"{len(contract):,} (stage, field, dtype) rows</summary>"
                     + table(contract, limit=HTML_ROWS) + "</details>")
    parts.append("<h2>Full summary</h2><details><summary>summary.json</summary>"
                 f"<pre>{e(json.dumps(jsonable(summary), indent=1, sort_keys=True))}</pre></details>")
    parts.append("<p class='note'>Tables: classes, findings, steps, contract (.parquet, .csv) "
                 "next to this file.</p></body></html>")
    return "\n".join(parts)


def class_table(classes: pd.DataFrame, occurrences: pd.DataFrame) -> str:
    """One row per class; its occurrences collapsed in the row below."""
    e = html.escape
    if classes.empty:
        return "<p class='expected'>no findings</p>"
    head = ("<tr><th>verdict</th><th>class · reproduce</th><th>occurrences</th><th>first seen</th>"
            "<th>last seen</th><th>requests</th><th>why</th></tr>")
    rows = []
    for c in classes.itertuples(index=False):
        first = _where(c.first_trace, c.first_pcp_size, c.first_step, c.first_rank)
        extra = []
        if getattr(c, "first_example", -1) not in (-1, None) and c.first_example >= 0:
            extra.append(f"example {c.first_example}")
        elapsed = getattr(c, "first_elapsed_s", float("nan"))
        if isinstance(elapsed, float) and math.isfinite(elapsed):
            extra.append(f"after {elapsed:.1f} s")
        if extra:
            first += " (" + ", ".join(extra) + ")"
        last = _where(c.last_trace, c.last_pcp_size, c.last_step, c.last_rank)
        why = c.explanation or c.message
        if c.evidence:
            why += f" — evidence: {c.evidence}"
        reproduce = f"<br><code>{e(c.reproduce)}</code>" if c.reproduce else ""
        if getattr(c, "repro_pytest", ""):  # a pytest file for vLLM's own tests
            reproduce += f"<br><span class='note'>pytest file for vLLM:</span> <code>{e(c.repro_pytest)}</code>"
        rows.append(
            f"<tr><td class='{e(c.verdict)}'>{e(c.verdict)}</td><td class='cls'><b>{e(c.signature)}</b>"
            f"<br><span class='note'>checks: {e(c.checks)}</span>{reproduce}</td>"
            f"<td>{c.occurrences:,} in {c.traces} trace(s)</td>"
            f"<td title='{e(c.first_trace)}'>{e(first)}</td>"
            f"<td title='{e(c.last_trace)}'>{e(last)}</td><td>{e(c.req_ids)}</td>"
            f"<td class='why'>{e(why)}</td></tr>")
        occ = _occurrences_of(c, occurrences)
        if occ is not None and len(occ):
            cols = [col for col in OCCURRENCE_COLUMNS if col in occ.columns]
            rows.append(f"<tr class='occ'><td></td><td colspan='6'><details><summary>"
                        f"{len(occ):,} occurrence row(s)</summary>"
                        + table(occ[cols], limit=OCCURRENCES_SHOWN) + "</details></td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _where(trace: str, pcp_size: int, step: int, rank: int) -> str:
    """'chunked.jsonl.gz step 3 pcp 2 rank 1' (the full path is the cell's title)."""
    name = trace.rsplit("/", 1)[-1]
    text = " ".join(p for p in (name, f"step {step}" if step >= 0 else "") if p)
    if pcp_size and pcp_size > 1:
        text += f" pcp {pcp_size}"
    if rank is not None and rank >= 0:
        text += f" rank {rank}"
    return text


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
