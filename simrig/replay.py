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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from simrig import lifeline
from simrig import observe as obs
from simrig.checks.checker import Checker, check_step
from simrig.errors import UsageError
from simrig.findings import findings as fk
from simrig.findings.classes import Where, fails_run, signature_text, verdict_of
from simrig.findings.expected import mark_expected, missing_expectations
from simrig.findings.findings import Finding
from simrig.progress import Progress
from simrig.report.recorder import (  # noqa: F401 -- re-exported: campaigns and shards record as replay does
    FIRST_FINDINGS,
    KNOWN_ROWS_PER_SIGNATURE,
    ReplayRecorder,
    ReplayResult,
    finding_columns,
    sort_rows,
)
from simrig.runners import shared_pool
from simrig.sampling_checks.seeds import SeedsRecord
from simrig.step import RunnerConfig, Step
from simrig.trace_io.trace import TraceHeader, TraceReader, trace_files_in


# ------------------------------------------------------------------ inputs
def expand_trace_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; a directory becomes its trace files, sorted by name."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = trace_files_in(path)
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


# ------------------------------------------------------------------- replay
def replay_trace(path: str | Path, *, pcp_sizes: Sequence[int] | None = None,
                 stages: Sequence[str] = obs.OPTIONAL_STAGES, progress: Progress | None = None,
                 recorder: ReplayRecorder | None = None) -> ReplayResult:
    """Replay one trace (once per PCP size) and return its tables."""
    return replay_traces([path], pcp_sizes=pcp_sizes, stages=stages, progress=progress,
                         recorder=recorder)


def replay_traces(paths: Sequence[str | Path], *, pcp_sizes: Sequence[int] | None = None,
                  stages: Sequence[str] = obs.OPTIONAL_STAGES, progress: Progress | None = None,
                  recorder: ReplayRecorder | None = None, cudagraph_mode: str | None = None,
                  stop: Callable[[], bool] | None = None, units: Any = None) -> ReplayResult:
    """Replay traces in order. A malformed line raises TraceError mid-way;
    callers that must not leave partial output validate first (scan_trace).
    ``cudagraph_mode`` replays every trace under that mode instead of its own;
    ``stop()`` true ends the replay before the next step (Ctrl-C), and the
    result holds every step replayed so far. ``units`` (a supervised replay,
    ``simrig.supervision.replay_workers``) is asked ``skip(i)`` before unit i (trace x
    PCP size, in order), told ``after_step(i)`` and ``done(i)``."""
    from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

    rec = recorder if recorder is not None else ReplayRecorder()
    api = load()
    used_sizes: list[int] = []
    unit = -1
    for path in paths:
        name = str(path)
        reader = TraceReader(path)  # a bad header fails before a Harness is built
        header = reader.header
        reader.close()
        for size in (pcp_sizes or [header.config.pcp_size]):
            unit += 1
            if stop is not None and stop():
                break
            config = header.config.replayed_as(size, cudagraph_mode)
            if size not in used_sizes:
                used_sizes.append(size)
            if units is not None and units.skip(unit):
                continue
            lifeline.mark_step(-1, unit)
            after = (lambda u=unit: units.after_step(u)) if units is not None else None
            _replay_one(name, header, config, stages, rec, progress, api, stop, after)
            if units is not None:
                units.done(unit)
    return recorded_result(rec, paths, used_sizes, stages)


def recorded_result(rec: ReplayRecorder, paths: Sequence[str | Path], pcp_sizes: Sequence[int],
                    stages: Sequence[str]) -> ReplayResult:
    """The tables of everything ``rec`` holds (also after an interrupted replay)."""
    from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

    api = load()
    return rec.result([str(p) for p in paths], list(pcp_sizes), tuple(stages),
                      vllm_version=api.version, device=f"{api.device} ({api.platform.mode})")


def _replay_one(name: str, header: TraceHeader, config: RunnerConfig, stages: Sequence[str],
                rec: ReplayRecorder, progress: Progress | None, api: Any,
                stop: Callable[[], bool] | None = None,
                after_step: Callable[[], None] | None = None) -> None:
    tracker = BatchTracker()
    for item in api.unavailable(config):  # reported; every other stage still runs
        rec.unavailable.append({"trace": name, "pcp_size": config.pcp_size, "stage": item.stage,
                                "capability": item.capability, "reason": item.reason})
    rec.where = Where(name, config.pcp_size, replay_args=replay_args(header.config, config, stages))
    before = rec.num_steps
    if progress is not None:
        progress.begin(f"{name} pcp={config.pcp_size}")
    start = time.perf_counter()
    try:
        for line, step, observation, found in replay_steps(name, config=config, stages=stages,
                                                           api=api, stop=stop):
            rec.record(name, config.pcp_size, line, step, tracker.observe(step), observation, found)
            if progress is not None:
                progress.update(rec.num_steps, rec.num_findings, rec.num_new)
            if after_step is not None:
                after_step()
    finally:
        rec.replay_s += time.perf_counter() - start
        rec.trace_lengths[name] = rec.num_steps - before


def replay_args(own: RunnerConfig, config: RunnerConfig, stages: Sequence[str]) -> tuple[str, ...]:
    """The `simrig replay` flags that replay a trace whose header says ``own``
    as ``config`` with ``stages`` (the reproducer command of a class)."""
    flags = (("--pcp-sizes", str(config.pcp_size), config.pcp_size != own.pcp_size),
             ("--cudagraph-mode", config.cudagraph_mode, config.cudagraph_mode != own.cudagraph_mode),
             ("--stages", ",".join(stages), tuple(stages) != tuple(obs.OPTIONAL_STAGES)))
    return tuple(x for flag, value, differs in flags if differs for x in (flag, value))


class ReplayedStep(NamedTuple):
    line: int  # the step's line in the trace file
    step: Step
    observation: obs.StepObs
    findings: list[Finding]


def replay_steps(path: str | Path, *, config: RunnerConfig | None = None,
                 stages: Sequence[str] = obs.OPTIONAL_STAGES,
                 extra_checks: Sequence[Any] = (), api: Any = None,
                 stop: Callable[[], bool] | None = None) -> Iterator[ReplayedStep]:
    """Replay a trace file through ``run_steps`` (the one replay loop)."""
    reader = TraceReader(path)  # a bad header fails before a Harness is built
    try:
        yield from run_steps(reader.header, reader, name=str(path), config=config, stages=stages,
                             extra_checks=extra_checks, api=api, stop=stop)
    finally:
        reader.close()


def run_steps(header: TraceHeader, lines_and_steps: Iterable[tuple[int, Step]], *, name: str = "",
              config: RunnerConfig | None = None, stages: Sequence[str] = obs.OPTIONAL_STAGES,
              extra_checks: Sequence[Any] = (), api: Any = None,
              stop: Callable[[], bool] | None = None) -> Iterator[ReplayedStep]:
    """The one replay loop: steps through a fresh Harness and Checker, with the
    findings ``check_step`` gives.

    Replay, shrinking, the self-test and the recorders' own verification all
    run a trace through here, so "reproduces" means the same everywhere. Loud
    rejections are those ``check_step`` marks: in an adversarial trace (or at a
    header's ``source.violation_steps``), only a KeyError or input note in
    lifecycle/gather naming an id the step's identity violation names. ``config`` overrides the header's (e.g.
    another PCP size). ``stop()`` true ends the loop before the next step:
    every step run so far is yielded, and the unread rest of the trace is
    not judged (no missing expectations).
    """
    from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

    config = config if config is not None else header.config
    violations = {int(k): v for k, v in (header.source.get("violation_steps") or {}).items()}
    runners = shared_pool()
    try:
        harness = runners.acquire(config, stages, api if api is not None else load())
        checker = Checker(config, adversarial=header.adversarial, trace=name)
    except ValueError as exc:  # the trace's config is one the runner cannot take
        raise UsageError(f"{name or 'trace'}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 -- a rig bug: reported, the run goes on
        failure = fk.rig_error(exc, step=0, stage="setup", check="harness", trace=name)
        yield ReplayedStep(0, Step(), obs.StepObs(index=0), [failure])
        return
    try:
        yield from _replay_loop(harness, checker, header, lines_and_steps, name, extra_checks,
                                violations, stop)
    finally:
        runners.release(harness)


def _replay_loop(harness: Any, checker: Any, header: TraceHeader,
                 lines_and_steps: Iterable[tuple[int, Step]], name: str, extra_checks: Sequence[Any],
                 violations: dict[int, str], stop: Callable[[], bool] | None) -> Iterator[ReplayedStep]:
    from simrig.harness import run_step_guarded  # late-bound: tests monkeypatch harness.run_step_guarded

    met: set[int] = set()  # indices of header.expect seen so far
    cause: Finding | None = None  # the undeclared input violation later findings follow from
    held: ReplayedStep | None = None  # one step held back: missing expectations join the last
    stopped = False
    seeds = SeedsRecord(harness.config)  # seeded requests replayed alone once the trace ends
    for line, step in lines_and_steps:
        if stop is not None and stop():
            stopped = True
            break
        lifeline.mark_step(harness.num_steps)
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
        seeds.observe(index, step, observation)
        mark_expected(header.expect, found, met)
        if not header.adversarial and index not in violations:
            cause = attribute_to_input_violation(found, cause)
        if held is not None:
            yield held
        held = ReplayedStep(line, step, observation, found)
    if held is not None:
        if not stopped:
            held.findings.extend(missing_expectations(header.expect, met, held.observation.index,
                                                      name))
            held.findings.extend(seeds.check(shared_pool(), harness.stages))
        yield held


def attribute_to_input_violation(found: list[Finding], cause: Finding | None) -> Finding | None:
    """One input violation is one class. In a trace that does not declare itself
    adversarial, the first ``contract_violation_input`` finding is the cause:
    every finding after it, in its step and in every later step, follows from
    input the runner was never meant to take (``Finding.caused_by``; the class
    table counts them as the cause's consequences). Returns the cause."""
    for f in found:
        if cause is None:
            if f.kind == fk.CONTRACT_VIOLATION_INPUT and not f.known:
                cause = f
            continue
        if f is cause or f.kind == fk.RIG_ERROR:
            continue  # simrig's own failures are never the input's fault
        f.caused_by = f"{signature_text(*cause.signature)} at step {cause.step}"
        f.extra["cause_key"] = (*cause.signature, verdict_of(cause))
    return cause


def replay_problems(header: TraceHeader, steps: Iterable[Step], api: Any = None) -> list[str]:
    """In-memory steps through the one loop: every exception a stage raised
    and every new finding, one line each (findings the checker marks
    ``known`` for this vLLM version are not counted)."""
    problems = []
    for replayed in run_steps(header, enumerate(steps), api=api):
        problems += [f"step {replayed.observation.index} {s.stage}[rank {s.rank}]: "
                     f"{s.error.type}: {s.error.message}" for s in replayed.observation.errors]
        problems += [f.one_line() for f in replayed.findings if fails_run(verdict_of(f))]
    return problems
