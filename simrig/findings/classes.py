"""Finding classes: one row per class, the headline of every report.

Occurrences (one Finding per step, stage and rank) are tallied into classes
(``ClassTally``, ``ClassStats``; ``merge_tallies`` for shards), each with its verdict
(``verdict_of``: new, known or expected), the one vocabulary of every report, banner
and exit status.

See docs/reports.md, 'Classes and occurrences' and 'Verdicts'.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from simrig.findings.findings import Finding
from simrig.findings.known import installed_vllm_version, load_known_findings

NEW, KNOWN, EXPECTED = "new", "known", "expected"
VERDICTS = (NEW, KNOWN, EXPECTED)
MAX_REQ_IDS = 8  # request ids kept per class (the occurrences table has them all)
CLASS_COLUMNS = ("signature", "verdict", "occurrences", "consequences", "kind", "stage", "field",
                 "exception_type", "checks", "traces", "first_trace", "first_pcp_size",
                 "first_step", "first_rank", "first_elapsed_s", "first_example", "last_trace",
                 "last_pcp_size", "last_step", "last_rank", "req_ids", "message", "reproducer",
                 "reproduce", "repro_pytest", "explanation", "evidence", "known_by")
# The stages whose batch the forward runs, and the dummy batches among them.
FORWARD_STAGES = ("prepare", "dummy", "capture", "profile")
DUMMY_STAGES = ("dummy", "capture", "profile")


def standalone_property(kind: str, stage: str, fld: str) -> str | None:
    """Which assertion of ``simrig repro``'s standalone file states the class, or
    None when the file states none (``repro`` refuses it; no report suggests it)."""
    if kind in ("key_error", "exception", "silent_acceptance"):
        return "raises_or_not"
    if kind == "dtype_drift" and stage in FORWARD_STAGES:
        return "dtype"
    if kind == "missing_field" and stage in DUMMY_STAGES:
        return "present"
    if kind == "value_mismatch":
        if fld == "positions" and stage in FORWARD_STAGES:
            return "positions"
        if stage == "prepare" and fld.startswith("attn.block_tables."):
            return "block_tables"
        if stage in ("prepare", "partition", "dummy") and fld.startswith("attn.filled_rows_past."):
            return "rows_past"
        if stage == "dispatch" and fld == "cg_mode":
            return "full_decode"
        if (stage, fld) in (("dispatch", "num_active_loras"), ("capture", "desc.num_active_loras")):
            return "lora"
        if stage in ("prepare", "partition") and fld.startswith("lora."):
            return "lora_mapping"
    return None


def verdict_of(finding: Finding) -> str:
    """new / known / expected for one occurrence (docs/reports.md, 'Verdicts')."""
    if finding.caused_by:  # the verdict of the class it follows from (its key's last part)
        return str(finding.extra.get("cause_key", (NEW,))[-1])
    if finding.known:
        return KNOWN
    if finding.extra.get("expected") or finding.extra.get("loud_rejection"):
        return EXPECTED
    return NEW


def fails_run(verdict: str) -> bool:
    """The one rule of every banner, table, summary, JUnit file, history row and
    exit status: a class fails the run exactly when its verdict is new. A known
    entry never covers another verdict's class of the same signature (the class
    key carries the verdict), so a different bug in a known field fails."""
    return verdict == NEW


def signature_text(kind: str, stage: str, fld: str, exception_type: str) -> str:
    """'key_error · gather · unknown_scheduled_id · KeyError' (empty parts left out)."""
    return " · ".join(p for p in (kind, stage, fld, exception_type) if p)


@dataclass
class Where:
    """Where one occurrence happened; campaigns add elapsed seconds and example number."""

    trace: str
    pcp_size: int = 1
    elapsed_s: float | None = None
    example: int | None = None
    replay_args: tuple[str, ...] = ()  # extra `simrig replay` flags that reproduce it


@dataclass
class ClassStats:
    kind: str
    stage: str
    field: str
    exception_type: str
    verdict: str
    occurrences: int = 0
    consequences: int = 0  # later findings attributed to this class (Finding.caused_by)
    checks: set[str] = field(default_factory=set)
    traces: dict[str, Where] = field(default_factory=dict)  # trace -> first Where there
    first: tuple[Where, int, int] | None = None  # (where, step, rank)
    last: tuple[Where, int, int] | None = None
    req_ids: list[str] = field(default_factory=list)
    message: str = ""
    reproducer: Where | None = None
    explanation: str = ""
    evidence: str = ""
    known_by: str = ""  # the known-findings entry that matched ("known-findings.json#13")

    @property
    def signature(self) -> str:
        return signature_text(self.kind, self.stage, self.field, self.exception_type)


class ClassTally:
    """Streams occurrences into per-class statistics (flat memory: counts and
    a few ids per class, never the occurrences themselves)."""

    def __init__(self) -> None:
        self.classes: dict[tuple[str, str, str, str, str], ClassStats] = {}

    def add(self, finding: Finding, where: Where, count: int = 1) -> ClassStats:
        verdict = verdict_of(finding)
        cause = self.classes.get(finding.extra.get("cause_key")) if finding.caused_by else None
        if cause is not None:  # what an input violation brought about: counted on its class
            cause.consequences += count
            return cause
        key = (*finding.signature, verdict)
        stats = self.classes.get(key)
        if stats is None:
            stats = self.classes[key] = ClassStats(*finding.signature, verdict=verdict,
                                                   message=finding.one_line())
        rank = -1 if finding.rank is None else int(finding.rank)
        if verdict == EXPECTED and not stats.explanation:
            stats.explanation = _why_expected(finding)
        if verdict == KNOWN and not stats.known_by:
            stats.known_by = str(getattr(finding, "known_by", "") or "")
        stats.occurrences += count
        stats.checks.add(finding.check)
        stats.traces.setdefault(where.trace, where)
        if stats.first is None:
            stats.first = (where, finding.step, rank)
        stats.last = (where, finding.step, rank)
        for req_id in finding.req_ids:
            if len(stats.req_ids) >= MAX_REQ_IDS:
                break
            if req_id not in stats.req_ids:
                stats.req_ids.append(req_id)
        return stats

    def choose_reproducers(self, lengths: dict[str, int]) -> None:
        """Each class's reproducer: the shortest trace (``lengths``: trace -> steps) it shows in."""
        for stats in self.classes.values():
            if stats.reproducer is None and stats.traces:
                name = min(stats.traces, key=lambda t: (lengths.get(t, 1 << 60), t))
                stats.reproducer = stats.traces[name]

    def explain(self, lookup: Any) -> None:
        """Fill explanation/evidence of known classes: ``lookup(kind, stage, field, check)``
        returns an object with ``explanation`` and ``evidence`` (or None)."""
        for stats in self.classes.values():
            if stats.verdict != KNOWN or stats.explanation:
                continue
            entries = [e for e in (lookup(stats.kind, stats.stage, stats.field, check)
                                   for check in sorted(stats.checks)) if e is not None]
            if entries:  # several checks may document one class: the fullest account wins
                entry = max(entries, key=lambda e: len(str(getattr(e, "explanation", ""))))
                stats.explanation = str(getattr(entry, "explanation", ""))
                stats.evidence = str(getattr(entry, "evidence", ""))
                if not stats.known_by:
                    stats.known_by = str(getattr(entry, "source", "") or "")

    def frame(self) -> pd.DataFrame:
        return class_frame(self.classes.values())


def merge_tallies(parts: Iterable[tuple[ClassTally, Callable[[Where], Where] | None]]) -> ClassTally:
    """One tally from several, in the order given (the parts of a sharded run:
    occurrences summed, first from the earliest part, last from the latest,
    request ids and checks joined); each part's places may be
    renamed (``rename(where) -> where``, e.g. a shard prefix)."""
    merged = ClassTally()
    for tally, rename in parts:
        def moved(where: Where) -> Where:
            return rename(where) if rename is not None else where

        for key, part in tally.classes.items():
            into = merged.classes.get(key)
            if into is None:
                into = merged.classes[key] = ClassStats(
                    part.kind, part.stage, part.field, part.exception_type, part.verdict,
                    message=part.message, explanation=part.explanation, evidence=part.evidence,
                    known_by=part.known_by)
            into.occurrences += part.occurrences
            into.consequences += part.consequences
            into.checks |= part.checks
            for where in part.traces.values():
                where = moved(where)
                into.traces.setdefault(where.trace, where)
            if part.first is not None and into.first is None:
                into.first = (moved(part.first[0]), *part.first[1:])
            if part.last is not None:
                into.last = (moved(part.last[0]), *part.last[1:])
            for req_id in part.req_ids:
                if len(into.req_ids) < MAX_REQ_IDS and req_id not in into.req_ids:
                    into.req_ids.append(req_id)
            if not into.explanation and part.explanation:
                into.explanation, into.evidence = part.explanation, part.evidence
    return merged


def _why_expected(finding: Finding) -> str:
    declared = finding.extra.get("expectation")
    if declared:
        return f"expected: the trace header declares {declared}"
    violation = finding.extra.get("violation")
    return ("expected: the runner loudly rejected a contract violation"
            + (f" ({violation})" if violation else "") + " sent on purpose")


def reproduce_command(where: Where | None) -> str:
    """The exact command that replays a class's shortest trace (paths inside the
    working directory relative to it)."""
    if where is None or not where.trace:
        return ""
    trace = where.trace
    if os.path.isabs(trace):
        rel = os.path.relpath(trace)
        trace = trace if rel.startswith("..") else rel
    args = ["simrig", "replay", trace, *where.replay_args]
    return " ".join(shlex.quote(a) for a in args)


_ORDER = {NEW: 0, EXPECTED: 1, KNOWN: 2}


def repro_command(c: ClassStats) -> str:
    """For a new class: the ``simrig repro`` command that writes its reproducer as a
    standalone pytest file for vLLM's own tests ("" for other verdicts and kinds)."""
    if (c.verdict != NEW or standalone_property(c.kind, c.stage, c.field) is None
            or c.reproducer is None or not c.reproducer.trace):
        return ""
    trace = shlex.split(reproduce_command(c.reproducer))[2]
    key = ":".join([c.kind, c.stage, c.field] + ([c.exception_type] if c.exception_type else []))
    name = "test_" + "_".join(p for p in (c.kind, c.stage, c.field.replace(".", "_")) if p) + ".py"
    return " ".join(shlex.quote(a) for a in ("simrig", "repro", trace, "--class", key, "--pytest", name))


def class_frame(classes: Iterable[ClassStats]) -> pd.DataFrame:
    """One row per class: new first, then expected, then known; then by signature."""
    rows = []
    for c in sorted(classes, key=lambda c: (_ORDER.get(c.verdict, 9), c.signature)):
        first_w, first_step, first_rank = c.first if c.first else (Where(""), -1, -1)
        last_w, last_step, last_rank = c.last if c.last else (Where(""), -1, -1)
        rows.append({
            "signature": c.signature, "verdict": c.verdict, "occurrences": c.occurrences,
            "consequences": c.consequences,
            "kind": c.kind, "stage": c.stage, "field": c.field,
            "exception_type": c.exception_type, "checks": ",".join(sorted(c.checks)),
            "traces": len(c.traces), "first_trace": first_w.trace,
            "first_pcp_size": first_w.pcp_size, "first_step": first_step,
            "first_rank": first_rank,
            "first_elapsed_s": float("nan") if first_w.elapsed_s is None else round(first_w.elapsed_s, 3),
            "first_example": -1 if first_w.example is None else first_w.example,
            "last_trace": last_w.trace, "last_pcp_size": last_w.pcp_size, "last_step": last_step,
            "last_rank": last_rank, "req_ids": ",".join(c.req_ids), "message": c.message,
            "reproducer": c.reproducer.trace if c.reproducer else "",
            "reproduce": reproduce_command(c.reproducer), "repro_pytest": repro_command(c),
            "explanation": c.explanation,
            "evidence": c.evidence, "known_by": c.known_by})
    return pd.DataFrame(rows, columns=list(CLASS_COLUMNS))


def verdict_counts(classes: pd.DataFrame) -> dict[str, int]:
    """{"classes": n, "new": .., "known": .., "expected": ..} of a class table."""
    counts = {"classes": int(len(classes))}
    for v in VERDICTS:
        counts[v] = int((classes["verdict"] == v).sum()) if len(classes) else 0
    return counts


def verdict_line(counts: dict[str, int], what: str = "finding class") -> str:
    """The banner: '2 new finding classes (1 known, 3 expected)' / 'no new finding classes …'."""
    new = counts.get(NEW, 0)
    rest = ", ".join(f"{counts.get(v, 0)} {v}" for v in (KNOWN, EXPECTED))
    plural = "es" if what.endswith("class") else "s"
    if new:
        return f"{new} new {what}{plural if new != 1 else ''} ({rest})"
    return f"no new {what}{plural} ({rest})"


def class_rows_for_print(classes: pd.DataFrame, limit: int = 10) -> list[str]:
    """Terminal lines: one per class, '[NEW] x12 signature — first: trace step 3 … ' + command."""
    out = []
    for row in classes.head(limit).itertuples(index=False):
        mark = row.verdict.upper() if row.verdict == NEW else row.verdict
        where = f"{row.first_trace} step {row.first_step}"
        if row.first_rank >= 0:
            where += f" rank {row.first_rank}"
        follow = getattr(row, "consequences", 0)
        follow = f" (+{follow} finding(s) that follow from it)" if follow else ""
        out.append(f"  [{mark}] x{row.occurrences} {row.signature}: first at {where}{follow}")
        if row.verdict == NEW:
            out.append(f"        {row.message[:200]}")
            if row.reproduce:
                out.append(f"        reproduce: {row.reproduce}")
            if getattr(row, "repro_pytest", ""):
                out.append(f"        pytest file for vLLM: {row.repro_pytest}")
        elif row.verdict == KNOWN and row.explanation:
            out.append(f"        known: {row.explanation[:140]}")
    if len(classes) > limit:
        out.append(f"  ... {len(classes) - limit} more classes in classes.csv")
    return out


def classes_from_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """A class table from occurrence rows (Finding.row() columns, optional ``verdict``),
    for callers that only hold the findings table."""
    tally = ClassTally()
    if rows is None or rows.empty or "kind" not in rows.columns:
        return tally.frame()
    for r in rows.to_dict("records"):
        def text(key: str) -> str:
            value = r.get(key, "")
            return "" if value is None or (isinstance(value, float) and value != value) else str(value)

        rank = r.get("rank", -1)
        finding = Finding(kind=text("kind"), step=int(r.get("step", -1) or 0), stage=text("stage"),
                          check=text("check"), rank=None if rank in (-1, None) else int(rank),
                          req_ids=tuple(x for x in text("req_ids").split(",") if x),
                          field=text("field"), message=text("message"),
                          exception_type=text("exception_type"), known=bool(r.get("known", False)),
                          known_by=text("known_by"))
        if text("verdict") == EXPECTED:
            finding.extra["expected"] = True
        tally.add(finding, Where(text("trace"), int(r.get("pcp_size", 1) or 1)))
    return tally.frame()


def known_lookup() -> Any:
    """(kind, stage, field, check) -> the documented known finding, for explanations."""
    try:
        known = load_known_findings(installed_vllm_version())
    except Exception:  # noqa: BLE001 -- an unreadable baseline only loses the explanation column
        return lambda *key: None

    def lookup(kind: str, stage: str, fld: str, check: str) -> Any:
        probe = Finding(kind=kind, step=0, stage=stage, check=check, field=fld)
        return known.match(probe)

    return lookup
