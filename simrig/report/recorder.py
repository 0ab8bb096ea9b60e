"""What a replay or a campaign keeps of each step: compact rows, a dtype
tally and the finding classes, turned into sorted pandas frames at the end.

    Step + StepObs + findings ──► ReplayRecorder.record ──► ColumnTable rows (steps, findings)
                                                          ├► contract tally (stage, field, kind, dtype)
                                                          └► ClassTally (one row per finding class)
    ReplayRecorder.result() ──► ReplayResult (frames, summary) ──► simrig.report.writer

Nothing per step is kept beyond a few row values: observations are dropped as
soon as the checks have seen them, so memory stays flat on long traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from simrig import observe as obs
from simrig.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_RIG_ERROR
from simrig.findings.classes import ClassTally, Where, fails_run, known_lookup, verdict_counts, verdict_of
from simrig.findings.findings import Finding
from simrig.report.tables import ColumnTable, kind_of
from simrig.report.timing import time_share
from simrig.step import Step

STEP_COLUMNS = ("trace", "pcp_size", "step", "line", "stage", "rank", "num_reqs", "num_tokens",
                "num_new", "num_cached", "num_decode", "num_prefill", "num_spec_tokens",
                "duration_ms", "error", "after_exception")
CONTRACT_COLUMNS = ("stage", "field", "kind", "dtype", "count", "first_trace", "first_pcp_size",
                    "first_step")
FIRST_FINDINGS = 20  # Finding objects kept whole, for the command's summary lines
# A known finding usually repeats on every step; past this many rows per
# (trace, PCP size, signature) it is counted, not listed, so memory and the
# findings table stay flat on long traces. New findings are always listed.
KNOWN_ROWS_PER_SIGNATURE = 50


@dataclass
class ReplayResult:
    """Everything a report needs; frames sorted deterministically."""

    steps: pd.DataFrame  # one row per step x stage x rank
    findings: pd.DataFrame  # Finding.row() + pcp_size
    contract: pd.DataFrame  # (stage, field, kind, dtype) -> count, first seen
    first_findings: list[Finding]  # the first new ones, then the first known ones
    traces: list[str]
    pcp_sizes: list[int]
    stages: tuple[str, ...]
    num_steps: int  # step replays (a trace replayed at 3 PCP sizes counts 3x)
    replay_s: float  # wall time inside the step loops
    vllm_s: float | None = None  # time inside vLLM's calls (StepObs.vllm_s summed)
    vllm_version: str = ""
    device: str = ""
    known_elided: dict[str, int] = field(default_factory=dict)  # kind -> known rows not listed
    classes: pd.DataFrame | None = None  # one row per finding class (report.classes)
    # Stages the installed release cannot drive, one entry per trace x PCP size.
    unavailable: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_rig_errors(self) -> int:
        return int((self.findings["kind"] == "rig_error").sum()) if len(self.findings) else 0

    @property
    def steps_after_exception(self) -> int:
        """Step replays run on a runner vLLM had raised in earlier (its state unknown)."""
        if not len(self.steps) or "after_exception" not in self.steps:
            return 0
        late = self.steps[self.steps["after_exception"] >= 0]
        return int(len(late.drop_duplicates(["trace", "pcp_size", "step"])))

    @property
    def exit_status(self) -> int:
        """EXIT_RIG_ERROR when simrig's own code failed, else 1 for new findings, else 0."""
        if self.num_rig_errors:
            return EXIT_RIG_ERROR
        return EXIT_FINDINGS if self.num_new else EXIT_CLEAN

    @property
    def num_new(self) -> int:
        """New finding occurrences (neither known nor expected): exit 1 when > 0."""
        return int(self.findings["verdict"].astype(str).map(fails_run).sum()) if len(self.findings) else 0

    def summary(self) -> dict[str, Any]:
        f = self.findings
        by_kind = {str(k): int(v) for k, v in f["kind"].value_counts().items() if v} if len(f) else {}
        for kind, count in self.known_elided.items():
            by_kind[kind] = by_kind.get(kind, 0) + count
        elided = sum(self.known_elided.values())
        verdicts = (self.findings["verdict"].astype(str).value_counts()
                    if len(f) else pd.Series(dtype=int))
        return {
            "verdict": "new findings" if self.num_new else "clean",
            "classes": verdict_counts(self.classes if self.classes is not None
                                      else pd.DataFrame({"verdict": []})),
            "steps": self.num_steps,
            "rows": len(self.steps),
            "findings": len(f) + elided,
            "findings_by_kind": dict(sorted(by_kind.items())),
            "known": int(verdicts.get("known", 0)) + elided,
            "known_not_listed": elided,
            "expected": int(verdicts.get("expected", 0)),
            "new": self.num_new,
            "rig_errors": self.num_rig_errors,
            "steps_after_exception": self.steps_after_exception,
            "crashes": int((f["kind"] == "crash").sum()) if len(f) else 0,
            "replay_s": round(self.replay_s, 3),
            "time_share": time_share(self.steps, self.replay_s, self.vllm_s),
            "steps_per_s": round(self.num_steps / self.replay_s, 2) if self.replay_s > 0 else 0.0,
            "traces": list(self.traces),
            "pcp_sizes": list(self.pcp_sizes),
            "stages": list(self.stages),
            "vllm_version": self.vllm_version,
            "device": self.device,
            "unavailable": list(self.unavailable),
        }


@dataclass
class ReplayRecorder:
    """Accumulates rows across traces and PCP sizes; reusable by campaigns."""

    steps: ColumnTable = field(default_factory=lambda: ColumnTable(
        {c: ("str" if c in ("trace", "stage", "error") else
             "float64" if c == "duration_ms" else "int64") for c in STEP_COLUMNS}))
    findings: ColumnTable = field(default_factory=lambda: ColumnTable(finding_columns()))
    contract: dict[tuple[str, str, str, str], list[Any]] = field(default_factory=dict)
    first_findings: list[Finding] = field(default_factory=list)
    num_findings: int = 0
    num_new: int = 0
    num_steps: int = 0
    replay_s: float = 0.0
    vllm_s: float = 0.0  # StepObs.vllm_s summed over the recorded steps
    known_seen: dict[tuple, int] = field(default_factory=dict)
    known_elided: dict[str, int] = field(default_factory=dict)  # kind -> rows not listed
    classes: ClassTally = field(default_factory=ClassTally)
    where: Where | None = None  # the trace being replayed (set by the replay driver)
    trace_lengths: dict[str, int] = field(default_factory=dict)  # trace -> steps
    unavailable: list[dict[str, Any]] = field(default_factory=list)

    def record(self, trace: str, pcp_size: int, line: int, step: Step, composition: tuple,
               observation: obs.StepObs, found: list[Finding]) -> None:
        num_decode, num_prefill, num_spec = composition
        num_reqs = len(step.num_scheduled_tokens)
        num_tokens = step.total_num_scheduled_tokens
        num_new, num_cached = len(step.new_requests), len(step.cached)
        index = observation.index
        append = self.steps.append_values
        contract = self.contract
        for st in observation.stages:
            append(trace, pcp_size, index, line, st.stage, -1 if st.rank is None else st.rank,
                   num_reqs, num_tokens, num_new, num_cached, num_decode, num_prefill, num_spec,
                   st.duration_s * 1e3, st.error.type if st.error is not None else "",
                   -1 if observation.after_exception is None else observation.after_exception)
            for name, fo in st.fields.items():
                key = (st.stage, name, fo.kind, fo.dtype)
                entry = contract.get(key)
                if entry is None:
                    contract[key] = [1, trace, pcp_size, index]
                else:
                    entry[0] += 1
        self.num_steps += 1
        self.vllm_s += observation.vllm_s
        where = self.where if self.where is not None and self.where.trace == trace else None
        for finding in found:
            self.classes.add(finding, where or Where(trace, pcp_size))
            verdict = verdict_of(finding)
            if finding.known:
                key = (trace, pcp_size, finding.check, *finding.signature)
                seen = self.known_seen[key] = self.known_seen.get(key, 0) + 1
                if seen > KNOWN_ROWS_PER_SIGNATURE:
                    self.known_elided[finding.kind] = self.known_elided.get(finding.kind, 0) + 1
                    self.num_findings += 1
                    continue
            row = finding.row()
            row["trace"] = row["trace"] or trace
            row["pcp_size"] = pcp_size
            row["verdict"] = verdict
            self.findings.append(row)
            self.num_findings += 1
            self.num_new += fails_run(verdict)
            # Keep the first few new findings and the first few known ones, so
            # a flood of known findings never hides the first new one.
            same = sum(f.known == finding.known for f in self.first_findings)
            if same < FIRST_FINDINGS:
                self.first_findings.append(finding)

    def result(self, traces: Sequence[str], pcp_sizes: Sequence[int],
               stages: Sequence[str], vllm_version: str = "", device: str = "") -> ReplayResult:
        self.classes.choose_reproducers(self.trace_lengths)
        self.classes.explain(known_lookup())
        return ReplayResult(
            steps=sort_rows(self.steps.to_frame(), ("trace", "pcp_size", "step", "stage", "rank")),
            findings=sort_rows(self.findings.to_frame(),
                               ("trace", "pcp_size", "step", "stage", "rank", "kind", "check",
                                "field", "req_ids", "message")),
            contract=self.contract_frame(),
            first_findings=sorted(self.first_findings, key=lambda f: f.known), traces=list(traces),
            pcp_sizes=list(pcp_sizes), stages=tuple(stages), num_steps=self.num_steps,
            replay_s=self.replay_s, vllm_s=self.vllm_s, vllm_version=vllm_version, device=device,
            known_elided=dict(self.known_elided), classes=self.classes.frame(),
            unavailable=list(self.unavailable))

    def contract_frame(self) -> pd.DataFrame:
        rows = [(*key, *value) for key, value in self.contract.items()]
        frame = pd.DataFrame(rows, columns=list(CONTRACT_COLUMNS))
        return sort_rows(frame, ("stage", "field", "kind", "dtype"))


def finding_columns() -> dict[str, str]:
    """Findings table schema: Finding.row() plus pcp_size and verdict (typed from a blank row)."""
    blank = Finding(kind="", step=0, stage="", check="").row()
    blank["pcp_size"] = 0
    blank["verdict"] = ""
    return {c: kind_of(v) for c, v in blank.items()}


def sort_rows(frame: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Stable sort on the keys present; stages sort in execution order."""
    if frame.empty:
        return frame.reset_index(drop=True)
    order = {s: i for i, s in enumerate(obs.STAGES)}
    cols = [k for k in keys if k in frame.columns]

    def key(col: pd.Series) -> pd.Series:
        if col.name == "stage":
            return col.astype(str).map(lambda s: order.get(s, len(order)))
        if isinstance(col.dtype, pd.CategoricalDtype):
            return col.astype(str)
        return col

    return frame.sort_values(cols, key=key, kind="stable").reset_index(drop=True)
