"""Coverage in a run: the shared flags, one collector per process, the report parts.

    --coverage / --no-coverage          collect line and branch coverage of vLLM's MRV2 folder
    --unreached FILE                    the reviewed list of reasons (default simrig/coverage/unreached.toml)
    --fail-on-unexplained-coverage      exit 1 when a never-reached line of a driven function has no reason

A command calls ``begin(args)`` before anything runs (a malformed reasons file
is one line, exit 2), ``start()`` once vLLM is imported, ``stop()`` at the end
of its run, and ``report_parts(data)`` for the report: the tables
(``coverage_files``, ``coverage_functions``, ``coverage_unreached``,
``coverage_branches``; parquet, CSV, and a section of ``report.html``) and
``summary["coverage"]``. Ray workers and child processes collect their own data
(told by their task's arguments); the driver merges it (``collect.merge``) and
analyses it with its reasons list.
"""

from __future__ import annotations

import argparse
from typing import Any

from simrig.coverage.collect import Collector, CoverageData, merge, to_jsonable
from simrig.coverage.reasons import Reasons, load_reasons

FINDING_KIND = "unexplained_coverage"
EXIT_UNEXPLAINED = 1


def add_coverage_flags(p: argparse.ArgumentParser, *, default: bool) -> None:
    p.add_argument("--coverage", action=argparse.BooleanOptionalAction, default=default,
                   help="collect line and branch coverage of the installed vLLM's MRV2 code "
                        "(vllm/v1/worker/gpu/) with coverage.py's C tracer: per-file and per-function "
                        "tables and every never-reached line of a driven function in the report "
                        f"(default {'on' if default else 'off'}; only vLLM's own calls are traced and "
                        "repeated kernel launches sampled: about 1.1x the time per step on CPU)")
    p.add_argument("--unreached", metavar="FILE", default=None,
                   help="the reviewed list of reasons why lines are never reached "
                        "(default: simrig/coverage/unreached.toml, or SIMRIG_UNREACHED)")
    p.add_argument("--fail-on-unexplained-coverage", action="store_true",
                   help="exit 1 when a never-reached line of a driven function has no reason in "
                        "the list (an unexplained_coverage finding; reported, not failing, by default)")


class CoverageRun:
    """What one command does about coverage; inert when coverage is off."""

    def __init__(self, enabled: bool, reasons: Reasons | None = None, fail_on_unexplained: bool = False,
                 reasons_path: Any = None):
        self.enabled = enabled
        self.reasons = reasons
        self.reasons_path = reasons_path  # read when the report is made (a shard never reads it)
        self.fail_on_unexplained = fail_on_unexplained
        self.collector: Collector | None = None
        self.parts: list[CoverageData] = []  # data from shards / children

    @classmethod
    def begin(cls, args: argparse.Namespace) -> CoverageRun:
        """From a command's flags; the reasons list is read now (a malformed one is
        exit 2 before the run). Nothing is put in the environment: shards and
        children only send arcs back, the driver analyses them with this list."""
        enabled = bool(getattr(args, "coverage", False))
        path = getattr(args, "unreached", None)
        reasons = load_reasons(path) if enabled or path else None
        return cls(enabled, reasons, bool(getattr(args, "fail_on_unexplained_coverage", False)))

    def start(self) -> None:
        if not self.enabled:
            return
        if self.collector is None:
            self.collector = Collector()
        self.collector.start()

    def stop(self) -> None:
        if self.collector is not None:
            self.collector.stop()

    def add(self, data: CoverageData | None) -> None:
        if data:
            self.parts.append(data)

    def data(self) -> CoverageData:
        own = self.collector.data() if self.collector is not None else {}
        return merge([own, *self.parts])

    def report_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(extra report tables, summary entries); both empty when coverage is off."""
        if not self.enabled:
            return {}, {}
        reasons = self.reasons if self.reasons is not None else load_reasons(self.reasons_path)
        extra, summary = coverage_report_parts(self.data(), reasons)
        if self.collector is not None:  # this process's kernel launches (shards keep their own)
            launches = self.collector.launches
            summary["coverage"]["kernel_launches_traced"] = launches.traced_launches
            summary["coverage"]["kernel_launches_skipped"] = launches.skipped_launches
        return extra, summary

    def exit_status(self, status: int, summary: dict[str, Any]) -> int:
        """``status`` raised to 1 when asked to fail on unexplained lines and there are some."""
        cov = summary.get("coverage") or {}
        if self.fail_on_unexplained and cov.get("unexplained_lines") and status == 0:
            return EXIT_UNEXPLAINED
        return status


def coverage_report_parts(data: CoverageData, reasons: Reasons | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    from simrig.coverage.analysis import analyze  # cold path: keeps pandas off simrig --help

    reasons = reasons if reasons is not None else load_reasons()  # SIMRIG_UNREACHED or the shipped list
    tables = analyze(data, reasons)
    unreached = tables.unreached.copy()
    unreached.insert(0, "finding_kind", ["" if e else FINDING_KIND for e in unreached["explained"]])
    summary = tables.summary()
    summary["tracer"] = "coverage.py CTracer (branch)"
    summary["reasons_file"] = reasons.source if reasons is not None else ""
    summary["reached_arcs"] = sum(len(v) for v in data.values())
    extra = {"coverage_files": tables.files, "coverage_functions": tables.functions,
             "coverage_unreached": unreached, "coverage_branches": tables.branches}
    summary["data"] = to_jsonable(data)  # merged raw data: history keeps it per run
    return extra, {"coverage": summary}


def coverage_line(summary: dict[str, Any]) -> str | None:
    """The one terminal line about coverage, or None when it was off."""
    cov = summary.get("coverage")
    if not cov:
        return None
    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{v:.1f}%"
    line = (f"coverage: {pct(cov.get('lines_pct'))} of lines ({cov.get('lines_reached', 0):,}/"
            f"{cov.get('lines', 0):,}), {pct(cov.get('branches_pct'))} of branches in "
            f"{cov.get('driven_functions', 0)} driven MRV2 functions; "
            f"{cov.get('unreached_lines', 0)} never-reached lines, "
            f"{cov.get('unexplained_lines', 0)} unexplained ({FINDING_KIND})")
    return line


def without_coverage_data(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary as ``--json`` prints it: the raw arcs stay in summary.json only."""
    cov = summary.get("coverage")
    if not isinstance(cov, dict) or "data" not in cov:
        return summary
    return {**summary, "coverage": {k: v for k, v in cov.items() if k != "data"}}
