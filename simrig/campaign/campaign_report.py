"""The one report writer of fuzz campaigns, one-process and sharded alike.

``write_campaign_report`` writes the shrunk traces, the report and ``junit.xml`` into a
staging folder of this run's own and swaps it into OUT, so two campaigns finishing
into the same OUT never touch each other's files. The campaign is duck-typed
(``simrig.campaign.fuzz.Campaign`` or the sharded driver's merged campaign).

See docs/commands.md, 'Errors, Ctrl-C and concurrent runs'.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import pandas as pd

from simrig.campaign.shrink import replay_command_args, save_regression, write_shrunk
from simrig.coverage.session import coverage_line, without_coverage_data
from simrig.findings.classes import Where, class_frame, class_rows_for_print, known_lookup, verdict_line, verdict_of
from simrig.history.changes import changes_line, since_previous
from simrig.history.store import record_history
from simrig.report.html import emit_json
from simrig.report.timing import time_share, time_share_line
from simrig.report.writer import write_summary_md


@dataclass
class ReportTables:
    """The tables of a campaign report besides its class and findings tables."""

    steps: Any  # one row per step x stage x rank (simrig.replay.ReplayRecorder)
    occurrences: Any  # every raw finding
    contract: Any
    busy_s: float  # wall seconds the steps were run in (summed over shards)
    title: str
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the shards table
    vllm_s: float | None = None  # time inside vLLM's calls (StepObs.vllm_s summed)


def write_campaign_report(campaign: Any, *, confirm: bool = True) -> dict[str, Any]:
    """Shrunk traces, report, junit.xml into OUT in one swap; returns summary.json
    (plus ``report``) and sets ``campaign.report_summary`` and ``campaign.class_table``.
    ``confirm``: replay each shrunk trace to check it reproduces its class (a
    sharded driver's shards already did)::

        campaign (classes, tally, stats; report_tables(), summary(), findings_frame())
          │
          ├─ each campaign class with a failing run ─► staging/shrunk/<class>.jsonl
          │                                            (replayed to confirm, when asked)
          ├─ simrig.report.writer.write_report ──────► staging/report/ (tables, summary.json, HTML)
          ├─ junit.xml (one testcase per class)
          └─ swap_into_place(staging/report, OUT) ─► OUT complete, or the earlier report
             then, and only then, --save-regressions copies failing traces to the regressions folder

    The staging folder is unique to this run (``staging_dir``): the later swap wins.
    """
    # late-bound: tests monkeypatch writer.write_report
    from simrig.report.writer import staging_dir, swap_into_place, write_report

    out = Path(campaign.options.out_dir)
    work = staging_dir(out, "fuzz")
    report, shrunk = work / "report", work / "shrunk"
    try:
        shrunk.mkdir()
        _write_shrunk_traces(campaign, shrunk, confirm)
        tables = campaign.report_tables()
        coverage = getattr(campaign, "coverage", None)
        cov_tables, cov_summary = coverage.report_parts() if coverage is not None else ({}, {})
        if cov_summary:
            campaign.unexplained_lines = cov_summary["coverage"]["unexplained_lines"]
            timeline = getattr(campaign, "coverage_timeline", None)
            if timeline:
                cov_tables["coverage_timeline"] = pd.DataFrame(timeline)
        summary = campaign.summary()
        summary.update(cov_summary)
        summary["time_share"] = time_share(tables.steps, tables.busy_s, tables.vllm_s)
        _choose_reproducers(campaign)
        classes = class_frame(campaign.tally.classes.values())

        summary["since_previous"] = since_previous(summary, classes)
        write_report(report, tables.steps, campaign.findings_frame(), tables.contract, summary,
                     extra_tables={"occurrences": tables.occurrences, "axes": campaign.stats.axes.frame(),
                                   **tables.extra, **cov_tables},
                     title=tables.title, classes=classes, occurrences=tables.occurrences,
                     headline=headline(summary), page_dir=out)
        written = json.loads((report / "summary.json").read_text())
        if any(shrunk.iterdir()):
            os.replace(shrunk, report / "shrunk")
        (report / "junit.xml").write_text(junit_xml(campaign), encoding="utf-8")
        swap_into_place(report, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    written["report"] = str(out)
    campaign.report_summary, campaign.class_table = written, classes
    o = campaign.options
    if o.save_regressions:  # only once the report that names them is in place
        for cls in _shrunk_classes(campaign):
            if cls.failing:
                save_regression(cls, o)
    return written


def _shrunk_classes(campaign: Any) -> list[Any]:
    """Classes the campaign itself found a failing run for (regression classes
    already have their trace)."""
    return [c for c in sorted(campaign.classes.values(), key=lambda c: c.key)
            if c.steps is not None and c.source == "campaign"]


def _write_shrunk_traces(campaign: Any, folder: Path, confirm: bool) -> None:
    """A shrunk trace whose confirming replay crashes is still written; the
    crash becomes a rig error of the campaign."""
    for cls in _shrunk_classes(campaign):
        try:
            write_shrunk(cls, campaign.options, folder, confirm=confirm)
        except Exception as exc:  # noqa: BLE001 -- reported, the report is still written
            campaign.rig_error(exc, "shrink")


def _choose_reproducers(campaign: Any) -> None:
    """Each class row's reproducer: its shrunk or regression trace; known classes explained."""
    args = replay_command_args(campaign.options.stages)
    for stats in campaign.tally.classes.values():
        for cls in campaign.classes.values():
            if tuple(cls.key[:4]) == (stats.kind, stats.stage, stats.field, stats.exception_type) \
                    and verdict_of(cls.first) == stats.verdict and cls.trace_path:
                stats.reproducer = Where(cls.trace_path, replay_args=args)
    campaign.tally.explain(known_lookup())


def findings_frame(campaign: Any) -> Any:
    """One row per class (sorted by class key): its first finding, count,
    verdict and shrunk trace (``findings.csv`` of a campaign)."""
    rows = []
    for cls in sorted(campaign.classes.values(), key=lambda c: c.key):
        row = cls.first.row()
        row.update(count=cls.count, verdict=cls.verdict, loud_rejection=cls.loud,
                   failing=cls.failing, source=cls.source, shrunk_trace=cls.trace_path,
                   shrunk_steps=len(cls.steps) if cls.steps is not None else -1,
                   example_steps=cls.example_steps,  # a crash class's example before it was shrunk
                   reproduced="" if cls.reproduced is None else str(cls.reproduced),
                   pcp_size=cls.config.pcp_size if cls.config else -1)
        rows.append(row)
    return pd.DataFrame(rows)


def headline(s: dict[str, Any]) -> str:
    """One line of facts under the banner (also the command's first line)."""
    where = f" on {s['workers']} workers" if s.get("workers") else ""
    repeat = ("; repeatable (same --seed, same examples)" if s.get("repeatable")
              else "; NOT repeatable: " + ", ".join(s.get("not_repeatable_because") or ["?"]))
    return (f"fuzz {s['mode']}{where}: {s['examples']:,} examples (+{s.get('shrink_runs', 0):,} shrink "
            f"runs), {s['steps']:,} steps in {s['elapsed_s']:.1f} s ({s['examples_per_s']:.2f} examples/s, "
            f"{s['steps_per_s']:.2f} steps/s), stopped by {s['stopped_by']}{repeat}; "
            f"{s['regression_traces']} regression trace(s) replayed first; "
            f"{s['loud_rejections']} loud rejections of {s['violations_sent']} violations"
            + graph_line(s))


def finish(campaign: Any, status: int, out_dir: Path, *, summary_md: str | None, json_out: bool,
           shard_rows: Any = ()) -> int:
    """After the report is written: --summary-md, the history row and what ``simrig fuzz``
    prints (``shard_rows``: the sharded driver's, one line each); returns ``status``."""
    s = campaign.report_summary
    write_summary_md(summary_md, "fuzz", s, campaign.class_table, headline(s), str(out_dir / "report.html"))
    record_history(s, campaign.class_table)
    for text in campaign.stats.rig_errors:
        print("simrig fuzz: rig error (a bug in simrig):\n" + text, file=sys.stderr)
    if json_out:
        emit_json(without_coverage_data(s))
        return status
    print(headline(s))
    print(verdict_line(s.get("classes", {})) + f" — exit {status}")
    for line in [*class_rows_for_print(campaign.class_table), changes_line(s)]:
        if line:
            print(line)
    for row in shard_rows:
        note = f" -- {row.note}" if row.note else ""
        print(f"  shard {row.shard} [{row.status}] {row.worker} seed {row.seed} pcp {row.pcp_sizes}: "
              f"{row.examples} examples (+{row.shrink_runs} shrink runs), {row.steps} steps, "
              f"{row.steps_per_s:.2f} steps/s, "
              f"{row.classes} classes{note}")
    for line in (time_share_line(s["time_share"]) if s.get("time_share") else "", coverage_line(s)):
        if line:
            print(line)
    if s.get("profile"):
        shares = s["profile"]["shares"]
        print("profile: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if v >= 0.005)
              + f" of the samples -- {out_dir / 'profile' / 'profile.txt'}")
    print(f"report: {out_dir / 'report.html'}")
    return status


def graph_line(summary: dict[str, Any]) -> str:
    """"; steps dispatched to graphs: FULL 1,234, NONE 567, PIECEWISE 890" (empty when unknown)."""
    chosen = summary.get("steps_by_dispatched_mode") or {}
    if not chosen:
        return ""
    return "; steps dispatched to " + ", ".join(f"{mode} {n:,}" for mode, n in chosen.items())


def junit_xml(campaign: Any) -> str:
    """One testcase per finding class: failure when failing, skipped when known,
    passed (with a note) for loud rejections."""
    classes = sorted(campaign.classes.values(), key=lambda c: c.key)
    mode = campaign.options.mode
    failures = sum(c.failing for c in classes) + len(campaign.stats.rig_errors)
    cases = []
    for cls in classes:
        name = quoteattr(":".join(str(x) for x in cls.key[:4]) + (" (loud rejection)" if cls.loud else "")
                         + (f" ({cls.verdict})" if cls.verdict == "known" else ""))
        body = escape(f"{cls.first.one_line()}\ncount={cls.count} trace={cls.trace_path}")
        if cls.failing:
            inner = f'<failure message={quoteattr(cls.first.one_line()[:200])}>{body}</failure>'
        elif cls.first.known:
            inner = f'<skipped message="known finding">{body}</skipped>'
        else:
            inner = f"<system-out>{body}</system-out>"
        cases.append(f'  <testcase classname="simrig.campaign.fuzz.{mode}" name={name} '
                     f'time="0">{inner}</testcase>')
    for i, text in enumerate(campaign.stats.rig_errors):
        cases.append(f'  <testcase classname="simrig.campaign.fuzz.rig" name="rig_error_{i}" time="0">'
                     f'<error message="simrig bug">{escape(text)}</error></testcase>')
    if not cases:
        cases.append(f'  <testcase classname="simrig.campaign.fuzz.{mode}" name="no findings" time="0"/>')
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            f'<testsuite name="simrig fuzz {mode}" tests="{len(cases)}" '
            f'failures="{failures}" time="{campaign.stats.elapsed_s}">\n' + "\n".join(cases)
            + "\n</testsuite>\n")
