"""Replay traces through the real MRV2 input path and tally what happened.

    TraceReader ──Step──► Harness.run_step ──StepObs──► Checker.check ──► findings
        (stream)             (real vLLM)          │                          │
                                                  ▼                          ▼
                                   ReplayRecorder: steps rows, contract tally, findings rows
                                                  │
                                                  ▼
                                   ReplayResult (pandas frames) ──► simrig.report.writer

Nothing per step is kept beyond a few compact row values: observations are
dropped as soon as the checks have seen them, so memory stays flat on long
traces. ``--pcp-sizes`` replays the same trace once per PCP world size, with a
fresh Harness and Checker each time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from simrig import observe as obs
from simrig.checks.findings import Finding
from simrig.errors import UsageError
from simrig.progress import Progress
from simrig.report.classes import NEW, ClassTally, Where, known_lookup, verdict_counts, verdict_of
from simrig.report.tables import ColumnTable, kind_of
from simrig.report.timing import time_share
from simrig.sources.trace import TraceHeader, TraceReader
from simrig.step import RunnerConfig, Step

TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
STEP_COLUMNS = ("trace", "pcp_size", "step", "line", "stage", "rank", "num_reqs", "num_tokens",
                "num_new", "num_cached", "num_decode", "num_prefill", "num_spec_tokens",
                "duration_ms", "error")
CONTRACT_COLUMNS = ("stage", "field", "kind", "dtype", "count", "first_trace", "first_pcp_size",
                    "first_step")
FIRST_FINDINGS = 20  # Finding objects kept whole, for the command's summary lines
# A known finding usually repeats on every step; past this many rows per
# (trace, PCP size, signature) it is counted, not listed, so memory and the
# findings table stay flat on long traces. New findings are always listed.
KNOWN_ROWS_PER_SIGNATURE = 50


# ------------------------------------------------------------------ inputs
def expand_trace_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; a directory becomes its trace files, sorted by name."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.iterdir()
                           if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise UsageError(f"{path}: directory holds no *.jsonl, *.jsonl.gz or *.jsonl.zst trace")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise UsageError(f"{path}: no such trace file or directory")
    return out


def scan_trace(path: str | Path) -> tuple[TraceHeader, int]:
    """Validate a whole trace without vLLM: (header, number of steps).

    Raises TraceError (``FILE:LINE: field: problem``) at the first bad line.
    Parsing costs well under a millisecond per step, so a run checks every
    input before spending the vLLM import and hours of replay on it.
    """
    reader = TraceReader(path)
    count = 0
    for _ in reader:
        count += 1
    return reader.header, count


def parse_pcp_sizes(text: str | None) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4]; None/'' -> None (use each trace's own pcp_size)."""
    if not text:
        return None
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--pcp-sizes: {part!r} is not a positive integer")
        if int(part) not in sizes:
            sizes.append(int(part))
    return sizes


def parse_stages(text: str | None) -> tuple[str, ...]:
    """'gather,dummy' -> the optional stages to run (lifecycle always runs)."""
    if not text:
        return obs.OPTIONAL_STAGES
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in obs.OPTIONAL_STAGES]
    if unknown:
        raise UsageError(f"--stages: unknown stage {unknown[0]!r}; choose from "
                         f"{', '.join(obs.OPTIONAL_STAGES)}")
    chosen = set(stages)
    if obs.PREPARE in chosen and obs.GATHER not in chosen:
        raise UsageError("--stages: prepare needs gather (it consumes gather's batch state)")
    if obs.PARTITION in chosen and obs.PREPARE not in chosen:
        raise UsageError("--stages: partition needs prepare (it splits prepare's batch)")
    return tuple(s for s in obs.OPTIONAL_STAGES if s in chosen)


# ------------------------------------------------------- batch composition
class BatchTracker:
    """Follows the trace's own request lengths to label each scheduled request.

    A scheduled request is a *prefill* while the tokens computed before the step
    are fewer than its prefill length (prompt, plus earlier outputs for a
    resumed request); otherwise a *decode*. An id the trace never added counts
    as a prefill when it schedules more than 1 + its drafts tokens.
    Holds only live requests: memory follows the batch, not the trace.
    """

    def __init__(self) -> None:
        self.live: dict[str, list[int]] = {}  # req_id -> [computed, prefill_len]

    def observe(self, step: Step) -> tuple[int, int, int]:
        """(num_decode, num_prefill, num_spec_tokens) of this step."""
        live = self.live
        for req_id in step.finished:
            live.pop(req_id, None)
        for req_id in step.preempted:
            live.pop(req_id, None)
        for req in step.new_requests:
            live[req.req_id] = [req.num_computed_tokens, req.num_prefill_tokens]
        for upd in step.cached:
            state = live.get(upd.req_id)
            if state is not None:
                state[0] = upd.num_computed_tokens
        num_prefill = 0
        for req_id, n in step.num_scheduled_tokens.items():
            state = live.get(req_id)
            if state is None:
                num_prefill += n > 1 + step.spec_tokens.get(req_id, 0)
            else:
                num_prefill += state[0] < state[1]
                state[0] += step.num_accepted(req_id)
        num_reqs = len(step.num_scheduled_tokens)
        return num_reqs - num_prefill, num_prefill, sum(step.spec_tokens.values())


# ---------------------------------------------------------------- recording
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
    def exit_status(self) -> int:
        """EXIT_RIG_ERROR when simrig's own code failed, else 1 for new findings, else 0."""
        from simrig.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_RIG_ERROR

        if self.num_rig_errors:
            return EXIT_RIG_ERROR
        return EXIT_FINDINGS if self.num_new else EXIT_CLEAN

    @property
    def num_new(self) -> int:
        """New finding occurrences (neither known nor expected): exit 1 when > 0."""
        return int((self.findings["verdict"] == NEW).sum()) if len(self.findings) else 0

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
            "replay_s": round(self.replay_s, 3),
            "time_share": time_share(self.steps, self.replay_s),
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
                   st.duration_s * 1e3, st.error.type if st.error is not None else "")
            for name, fo in st.fields.items():
                key = (st.stage, name, fo.kind, fo.dtype)
                entry = contract.get(key)
                if entry is None:
                    contract[key] = [1, trace, pcp_size, index]
                else:
                    entry[0] += 1
        self.num_steps += 1
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
            self.num_new += verdict == NEW
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
            replay_s=self.replay_s, vllm_version=vllm_version, device=device,
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


# ------------------------------------------------------------------- replay
def replay_trace(path: str | Path, *, pcp_sizes: Sequence[int] | None = None,
                 stages: Sequence[str] = obs.OPTIONAL_STAGES, progress: Progress | None = None,
                 recorder: ReplayRecorder | None = None) -> ReplayResult:
    """Replay one trace (once per PCP size) and return its tables."""
    return replay_traces([path], pcp_sizes=pcp_sizes, stages=stages, progress=progress,
                         recorder=recorder)


def replay_traces(paths: Sequence[str | Path], *, pcp_sizes: Sequence[int] | None = None,
                  stages: Sequence[str] = obs.OPTIONAL_STAGES, progress: Progress | None = None,
                  recorder: ReplayRecorder | None = None, cudagraph_mode: str | None = None) -> ReplayResult:
    """Replay traces in order. A malformed line raises TraceError mid-way;
    callers that must not leave partial output validate first (scan_trace).
    ``cudagraph_mode`` replays every trace under that mode instead of its own."""
    from simrig.adapters.runner import load

    rec = recorder if recorder is not None else ReplayRecorder()
    api = load()
    used_sizes: list[int] = []
    for path in paths:
        name = str(path)
        reader = TraceReader(path)  # a bad header fails before a Harness is built
        header = reader.header
        reader.close()
        for size in (pcp_sizes or [header.config.pcp_size]):
            config = header.config.replayed_as(size, cudagraph_mode)
            if size not in used_sizes:
                used_sizes.append(size)
            _replay_one(name, header, config, stages, rec, progress, api)
    return rec.result([str(p) for p in paths], used_sizes, tuple(stages),
                      vllm_version=api.version, device=f"{api.device} ({api.platform.mode})")


def _replay_one(name: str, header: TraceHeader, config: RunnerConfig, stages: Sequence[str],
                rec: ReplayRecorder, progress: Progress | None, api: Any) -> None:
    tracker = BatchTracker()
    for item in api.unavailable(config):  # reported; every other stage still runs
        rec.unavailable.append({"trace": name, "pcp_size": config.pcp_size, "stage": item.stage,
                                "capability": item.capability, "reason": item.reason})
    args: tuple[str, ...] = ()
    if config.pcp_size != header.config.pcp_size:
        args += ("--pcp-sizes", str(config.pcp_size))
    if config.cudagraph_mode != header.config.cudagraph_mode:
        args += ("--cudagraph-mode", config.cudagraph_mode)
    if tuple(stages) != tuple(obs.OPTIONAL_STAGES):
        args += ("--stages", ",".join(stages))
    rec.where = Where(name, config.pcp_size, replay_args=args)
    before = rec.num_steps
    if progress is not None:
        progress.begin(f"{name} pcp={config.pcp_size}")
    start = time.perf_counter()
    try:
        for line, step, observation, found in replay_steps(name, config=config, stages=stages,
                                                           api=api):
            rec.record(name, config.pcp_size, line, step, tracker.observe(step), observation, found)
            if progress is not None:
                progress.update(rec.num_steps, rec.num_findings, rec.num_new)
    finally:
        rec.replay_s += time.perf_counter() - start
        rec.trace_lengths[name] = rec.num_steps - before


class ReplayedStep(NamedTuple):
    line: int  # the step's line in the trace file
    step: Step
    observation: obs.StepObs
    findings: list[Finding]


def replay_steps(path: str | Path, *, config: RunnerConfig | None = None,
                 stages: Sequence[str] = obs.OPTIONAL_STAGES,
                 extra_checks: Sequence[Any] = (), api: Any = None) -> Iterator[ReplayedStep]:
    """Replay a trace file through ``run_steps`` (the one replay loop)."""
    reader = TraceReader(path)  # a bad header fails before a Harness is built
    try:
        yield from run_steps(reader.header, reader, name=str(path), config=config, stages=stages,
                             extra_checks=extra_checks, api=api)
    finally:
        reader.close()


def run_steps(header: TraceHeader, lines_and_steps: Iterable[tuple[int, Step]], *, name: str = "",
              config: RunnerConfig | None = None, stages: Sequence[str] = obs.OPTIONAL_STAGES,
              extra_checks: Sequence[Any] = (), api: Any = None) -> Iterator[ReplayedStep]:
    """The one replay loop: steps through a fresh Harness and Checker, with the
    findings ``check_step`` gives.

    Replay, shrinking, the self-test and the recorders' own verification all
    run a trace through here, so "reproduces" means the same everywhere. Loud
    rejections are marked from the header's ``source.violation_steps``; an
    adversarial trace that names none counts every KeyError (or input
    violation) as a loud rejection. ``config`` overrides the header's (e.g.
    another PCP size).
    """
    from simrig.adapters.runner import load
    from simrig.checks import findings as fk
    from simrig.checks.checker import Checker, check_step
    from simrig.checks.expected import mark_expected, missing_expectations
    from simrig.checks.lifecycle import LOUD_KINDS
    from simrig.harness import Harness, run_step_guarded

    config = config if config is not None else header.config
    violations = {int(k): v for k, v in (header.source.get("violation_steps") or {}).items()}
    try:
        harness = Harness(config, stages=stages, api=api if api is not None else load())
        checker = Checker(config, adversarial=header.adversarial, trace=name)
    except ValueError as exc:  # the trace's config is one the runner cannot take
        raise UsageError(f"{name or 'trace'}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 -- a rig bug: reported, the run goes on
        failure = fk.rig_error(exc, step=0, stage="setup", check="harness", trace=name)
        yield ReplayedStep(0, Step(), obs.StepObs(index=0), [failure])
        return
    met: set[int] = set()  # indices of header.expect seen so far
    held: ReplayedStep | None = None  # one step held back: missing expectations join the last
    for line, step in lines_and_steps:
        observation, rig_errors = run_step_guarded(harness, step, name)
        index = observation.index
        if rig_errors:
            # The harness stopped mid-step: the runner's state no longer
            # follows the trace, so the rest of this trace is not replayed
            # (and its expectations cannot be judged).
            if held is not None:
                yield held
            yield ReplayedStep(line, step, observation, rig_errors)
            return
        found = check_step(checker, extra_checks, index, step, observation,
                           violations.get(index), name)
        if header.adversarial and not violations:
            for f in found:
                if f.kind in LOUD_KINDS:
                    f.extra["loud_rejection"] = True
        mark_expected(header.expect, found, met)
        if held is not None:
            yield held
        held = ReplayedStep(line, step, observation, found)
    if held is not None:
        held.findings.extend(missing_expectations(header.expect, met, held.observation.index, name))
        yield held


def replay_problems(header: TraceHeader, steps: Iterable[Step], api: Any = None) -> list[str]:
    """In-memory steps through the one loop: every exception a stage raised
    and every new finding, one line each (findings the checker marks
    ``known`` for this vLLM version are not counted)."""
    problems = []
    for replayed in run_steps(header, enumerate(steps), api=api):
        problems += [f"step {replayed.observation.index} {s.stage}[rank {s.rank}]: "
                     f"{s.error.type}: {s.error.message}" for s in replayed.observation.errors]
        problems += [f.one_line() for f in replayed.findings if verdict_of(f) == NEW]
    return problems
