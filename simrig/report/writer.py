"""Reports: pandas tables to parquet + CSV, summary.json, one self-contained HTML.

    OUT/
      steps.parquet     steps.csv       one row per step x stage x rank
      findings.parquet  findings.csv    Finding.row() + pcp_size
      contract.parquet  contract.csv    (stage, field, kind, dtype) -> count
      <extra>.parquet   <extra>.csv     campaign tables (write_report(extra_tables=...))
      summary.json                      counts, versions, device, timings
      report.html                       summary, plots (inline PNG), findings, contract

The whole directory is written under a temporary name next to OUT and renamed
into place, so an interrupted run never leaves a half-written report. Rows are
sorted by the caller (simrig.replay.sort_rows): the same input gives the same
files apart from timing columns.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import shutil
import tempfile
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.errors import UsageError

REPORT_FILES = ("steps.parquet", "steps.csv", "findings.parquet", "findings.csv",
                "contract.parquet", "contract.csv", "summary.json", "report.html")
HTML_ROWS = 200  # rows per table shown in the HTML (the files hold all)
FINDING_HTML_COLUMNS = ("kind", "known", "trace", "pcp_size", "step", "stage", "rank", "check",
                        "field", "req_ids", "expected", "actual", "message")


def simrig_version() -> str:
    try:
        return version("simrig")
    except PackageNotFoundError:
        return "unknown"


def default_out_dir(kind: str = "replay", root: str | Path = "reports") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / f"{kind}-{stamp}"


def check_out_dir(out_dir: str | Path) -> Path:
    """Fail before a run if OUT cannot take a report: it may be missing, empty,
    or an earlier report (replaced whole); anything else is refused."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out: {out} exists and is not a directory")
        if any(out.iterdir()) and not (out / "summary.json").is_file():
            raise UsageError(f"--out: {out} is a non-empty directory that is not a simrig report")
    return out


def write_report(out_dir: str | Path, steps: pd.DataFrame, findings: pd.DataFrame,
                 contract: pd.DataFrame, summary: dict[str, Any],
                 extra_tables: dict[str, pd.DataFrame] | None = None,
                 title: str = "simrig replay report") -> Path:
    """Write the report directory atomically; returns its path."""
    out = check_out_dir(out_dir)
    extra_tables = dict(extra_tables or {})
    clash = set(extra_tables) & {"steps", "findings", "contract", "summary", "report"}
    if clash:
        raise ValueError(f"extra_tables: reserved name(s) {sorted(clash)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a report is not
    try:
        summary = {"simrig_version": simrig_version(),
                   "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   **summary}
        tables = {"steps": steps, "findings": findings, "contract": contract, **extra_tables}
        for name, frame in tables.items():
            frame.to_parquet(tmp / f"{name}.parquet", index=False)
            frame.to_csv(tmp / f"{name}.csv", index=False)
        (tmp / "summary.json").write_text(json.dumps(_jsonable(summary), indent=2, sort_keys=True) + "\n")
        (tmp / "report.html").write_text(render_html(title, summary, steps, findings, contract,
                                                     extra_tables), encoding="utf-8")
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished directory to OUT; an earlier report there is moved
    aside first and removed only once the new one is in place."""
    old = None
    if out.exists():
        if not any(out.iterdir()):
            out.rmdir()
        else:
            old = Path(tempfile.mkdtemp(prefix=f".old-{out.name}-", dir=out.parent))
            os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------- HTML
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}tr:nth-child(even){background:#fafafa}
.new{color:#b00;font-weight:bold}.known{color:#777}.ok{color:#070;font-weight:bold}
.note{color:#666;font-size:12px}img{max-width:100%}
td.msg{max-width:420px;word-break:break-word}
"""


def render_html(title: str, summary: dict[str, Any], steps: pd.DataFrame, findings: pd.DataFrame,
                contract: pd.DataFrame, extra_tables: dict[str, pd.DataFrame]) -> str:
    from simrig.report import plots

    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{e(title)}</h1>"]
    new = int(summary.get("new", 0) or 0)
    verdict = (f"<p class='new'>{new} new finding(s)</p>" if new
               else "<p class='ok'>no new findings</p>")
    parts.append(verdict)
    parts.append("<h2>Summary</h2>" + _kv_table(summary))
    parts.append("<h2>Findings</h2>")
    if findings.empty:
        parts.append("<p class='ok'>none</p>")
    else:
        counts = (findings.assign(known=findings["known"].astype(bool).map({True: "known", False: "new"}))
                  .groupby(["kind", "known"], observed=True).size().rename("count").reset_index())
        parts.append(_table(counts))
        cols = [c for c in FINDING_HTML_COLUMNS if c in findings.columns]
        parts.append(_table(findings[cols], limit=HTML_ROWS, mark_known=True))
    parts.append("<h2>Plots</h2>")
    for caption, png in (("Batch composition over steps", plots.batch_composition(steps)),
                         ("Stage latency", plots.stage_latency(steps))):
        if png is not None:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<h3>{e(caption)}</h3><img alt='{e(caption)}' "
                         f"src='data:image/png;base64,{data}'>")
    parts.append("<h2>Observed dtype contract</h2>" + _table(contract, limit=HTML_ROWS))
    for name, frame in extra_tables.items():
        parts.append(f"<h2>{e(name)}</h2>" + _table(frame, limit=HTML_ROWS))
    parts.append("<p class='note'>Full tables: steps, findings, contract (.parquet, .csv) "
                 "next to this file.</p></body></html>")
    return "\n".join(parts)


def _kv_table(summary: dict[str, Any]) -> str:
    rows = []
    for key, value in summary.items():
        shown = json.dumps(_jsonable(value)) if isinstance(value, (dict, list, tuple)) else str(value)
        rows.append(f"<tr><th>{html.escape(str(key))}</th><td>{html.escape(shown)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _table(frame: pd.DataFrame, limit: int | None = None, mark_known: bool = False) -> str:
    if frame.empty:
        return "<p class='note'>(empty)</p>"
    shown = frame if limit is None else frame.head(limit)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = []
    known_col = list(shown.columns).index("known") if mark_known and "known" in shown.columns else -1
    for row in shown.itertuples(index=False):
        cells = []
        for i, value in enumerate(row):
            text = html.escape(str(value))
            if i == known_col:
                cls, text = ("known", "known") if bool(value) else ("new", "new")
                cells.append(f"<td class='{cls}'>{text}</td>")
            else:
                cells.append(f"<td class='msg'>{text}</td>" if len(text) > 40 else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = (f"<p class='note'>first {limit} of {len(frame):,} rows</p>"
            if limit is not None and len(frame) > limit else "")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{note}"
