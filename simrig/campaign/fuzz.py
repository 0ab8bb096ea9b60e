"""Fuzz campaigns: the stateful scheduler machine against the real runner, for a time budget.

    1. replay traces/regressions/*  (every shrunk failure found so far)
    2. loop until the budget is spent:                        one Hypothesis run ("chunk")
         SchedulerContractMachine examples ──► findings ──► new finding class? ─► fail the example
                                                                                  │ Hypothesis shrinks it;
                                                                                  │ every failing run is a
                                                                                  ▼ candidate, smallest kept
                                                         class tolerated from the next chunk on
    3. each class: its smallest failing run ─► --out/shrunk/*.jsonl (v1 trace), replayed to confirm
    4. report (simrig.report.writer), campaign.json figures, junit.xml (one testcase per class)

A finding class is (kind, stage, field, exception type) plus whether it was a
loud rejection of an adversarial violation (the expected reaction). Exit
status 1 means a class that is neither known nor a loud rejection.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simrig.campaign.shrink import class_key, replay_with_checks
from simrig.checks.findings import Finding
from simrig.observe import DISPATCH, OPTIONAL_STAGES
from simrig.replay import BatchTracker, ReplayRecorder
from simrig.report.classes import ClassTally, Where, known_lookup, verdict_of
from simrig.step import CUDAGRAPH_MODES, RunnerConfig, Step

Key = tuple[str, str, str, str, bool]  # signature + loud rejection


@dataclass
class CampaignOptions:
    budget_s: float = 60.0
    seed: int = 0
    mode: str = "valid"
    pcp_sizes: tuple[int, ...] = (1, 2)
    # vLLM cudagraph modes to draw configs from (each step dispatched and padded
    # by vLLM's own CudaGraphManager); the default covers all five.
    cudagraph_modes: tuple[str, ...] = CUDAGRAPH_MODES
    out_dir: Path = Path("reports/fuzz")
    database: Any = Path(".cache/hypothesis")  # a folder, None, or a Hypothesis ExampleDatabase
    max_examples: int | None = None  # stop after this many examples (else budget only)
    save_regressions: bool = False
    regressions_dir: Path = Path("traces/regressions")
    replay_regressions: bool = True
    stages: tuple[str, ...] = OPTIONAL_STAGES
    extra_checks: Sequence[Any] = ()  # fn(index, step, obs) -> list[Finding]
    violations: tuple[str, ...] | None = None  # adversarial violations (default: all)
    steps_per_example: int = 20  # Hypothesis stateful_step_count
    chunk_examples: int = 10  # examples per Hypothesis run
    shrink_grace_s: float | None = None  # extra time to finish a shrink (default budget/4, <= 120 s)
    progress: str | None = None  # tty / plain / quiet (default: tty when stderr is one)
    configs: Any = None  # strategy of RunnerConfig (default: small configs over pcp_sizes)
    # fn(FindingClass): a class was first seen or got a smaller failing run. Sharded
    # campaigns (simrig.distributed) stream each one to their driver as it happens.
    on_class: Any = None


@dataclass
class FindingClass:
    key: Key
    first: Finding
    count: int = 0
    source: str = "campaign"  # "campaign" or the regression trace it came from
    steps: list[Step] | None = None  # smallest failing run (campaign classes)
    violations: dict[int, str] = field(default_factory=dict)
    config: RunnerConfig | None = None
    trace_path: str = ""
    reproduced: bool | None = None

    @property
    def loud(self) -> bool:
        return self.key[4]

    @property
    def failing(self) -> bool:
        return not self.first.known and not self.loud

    def size(self) -> tuple[int, int, int]:
        steps = self.steps or []
        return (len(steps), sum(len(s.num_scheduled_tokens) for s in steps),
                sum(s.total_num_scheduled_tokens for s in steps))


@dataclass
class CampaignStats:
    examples: int = 0
    steps: int = 0
    findings: int = 0  # finding occurrences (before dedupe)
    loud_rejections: int = 0
    violations_sent: int = 0
    chunks: int = 0
    regression_traces: int = 0
    regression_steps: int = 0
    elapsed_s: float = 0.0
    stopped_by: str = "budget"
    rig_errors: list[str] = field(default_factory=list)
    # steps per configured cudagraph mode, and per mode vLLM's dispatch chose
    steps_by_cudagraph_mode: dict[str, int] = field(default_factory=dict)
    steps_by_dispatched_mode: dict[str, int] = field(default_factory=dict)


class Campaign:
    """One fuzz campaign; ``run()`` returns the exit status."""

    def __init__(self, options: CampaignOptions):
        from strategies.machine import MODES

        if options.mode not in MODES:
            from simrig.errors import UsageError

            raise UsageError(f"--mode: must be one of {', '.join(MODES)}, got {options.mode!r}")
        self.options = options
        self.stats = CampaignStats()
        self.classes: dict[Key, FindingClass] = {}
        self.tolerated: set[Key] = set()  # classes already shrunk (or known)
        self.recorder = ReplayRecorder()  # steps rows and dtype tallies, as replay keeps them
        self.tally = ClassTally()  # one row per class for the report (first/last, example, time)
        self.interrupted = False
        self._start = 0.0
        self._chunk_failed = False
        self._progress: Any = None

    # ------------------------------------------------------------ time
    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _grace(self) -> float:
        o = self.options
        return o.shrink_grace_s if o.shrink_grace_s is not None else min(120.0, o.budget_s / 4)

    def _examples_done(self) -> bool:
        m = self.options.max_examples
        return m is not None and self.stats.examples >= m

    def stopped(self) -> bool:
        """Rules stop running the real code: interrupted, past the budget while
        exploring, or past budget + grace while shrinking."""
        if self.interrupted:
            return True
        over = self._elapsed() > self.options.budget_s or self._examples_done()
        if over and not self._chunk_failed:
            return True
        return self._elapsed() > self.options.budget_s + self._grace()

    # ------------------------------------------------------------ machine hooks
    def _on_step(self, machine: Any, index: int, step: Step, obs: Any,
                 found: list[Finding]) -> list[Finding]:
        st = self.stats
        st.steps += 1
        st.findings += len(found)
        configured = machine.config.cudagraph_mode
        st.steps_by_cudagraph_mode[configured] = st.steps_by_cudagraph_mode.get(configured, 0) + 1
        dispatch = obs.get(DISPATCH) if obs is not None else None
        if dispatch is not None and "cg_mode" in dispatch.fields:
            chosen = str(dispatch.fields["cg_mode"].values)
            st.steps_by_dispatched_mode[chosen] = st.steps_by_dispatched_mode.get(chosen, 0) + 1
        violation = machine.violations.get(index)
        st.violations_sent += violation is not None
        st.loud_rejections += any(f.extra.get("loud_rejection") for f in found)
        tracker = machine.__dict__.setdefault("_batch_tracker", BatchTracker())
        self.recorder.record(f"example-{st.examples}", machine.config.pcp_size, index + 2, step,
                             tracker.observe(step), obs, found)
        where = Where(f"example-{st.examples}", machine.config.pcp_size,
                      elapsed_s=self._elapsed(), example=st.examples)
        failing = []
        for f in found:
            self.tally.add(f, where)
            key = class_key(f)
            cls = self.classes.get(key)
            if cls is None:
                cls = self.classes[key] = FindingClass(key, f)
                self._notify(cls)
            cls.count += 1
            if key in self.tolerated or f.known:
                continue
            failing.append(f)
            self._offer(cls, machine)
        if failing:
            self._chunk_failed = True
        self._tick()
        return failing

    def _offer(self, cls: FindingClass, machine: Any) -> None:
        """Keep the smallest failing run seen for a class (Hypothesis shrinks towards it)."""
        steps = list(machine.steps)
        candidate = FindingClass(cls.key, cls.first, steps=steps)
        if cls.steps is None or candidate.size() < cls.size():
            cls.steps, cls.violations, cls.config = steps, dict(machine.violations), machine.config
            self._notify(cls)

    def _notify(self, cls: FindingClass) -> None:
        if self.options.on_class is not None:
            self.options.on_class(cls)

    def _on_teardown(self, machine: Any) -> None:
        if machine.steps:
            self.stats.examples += 1

    def _tick(self) -> None:
        if self._progress is not None:
            failing = sum(1 for c in self.classes.values() if c.failing)
            self._progress.label = f"fuzz {self.options.mode} | example {self.stats.examples:,}"
            self._progress.update(self.stats.steps, len(self.classes), failing)

    # ------------------------------------------------------------ phases
    def run(self) -> int:
        from simrig.adapters.runner import load
        from simrig.progress import Progress

        o = self.options
        api = load()  # the one-off vLLM import (~15 s) is not part of the budget
        self.vllm_version, self.device = api.version, f"{api.device} ({api.platform.mode})"
        self._start = time.perf_counter()
        self._progress = Progress(mode=o.progress, label=f"fuzz {o.mode}")
        handlers = _install_signal_handlers(self)
        try:
            if o.replay_regressions:
                self._progress.begin("regressions")
                self.replay_regressions()
            self._progress.begin("campaign")
            self.explore()
        finally:
            _restore_signal_handlers(handlers)
            self.stats.elapsed_s = round(self._elapsed(), 3)
            self._progress.close()
            self.finish()
        return self.exit_status()

    def replay_regressions(self) -> None:
        paths = sorted(p for p in Path(self.options.regressions_dir).glob("*.jsonl*") if p.is_file())
        for path in paths:
            if self.interrupted:
                return
            found, num_steps = replay_with_checks(path, self.options.extra_checks, self.options.stages)
            self.stats.regression_traces += 1
            self.stats.regression_steps += num_steps
            where = Where(str(path), elapsed_s=self._elapsed())  # before any example
            for f in found:
                self.tally.add(f, where)
                key = class_key(f)
                cls = self.classes.get(key)
                if cls is None:
                    cls = self.classes[key] = FindingClass(key, f, source=str(path),
                                                           trace_path=str(path), reproduced=True)
                    self._notify(cls)
                cls.count += 1
                self.tolerated.add(key)  # already has a minimal trace: do not shrink it again

    def explore(self) -> None:
        from hypothesis import HealthCheck, Phase, Verbosity, settings
        from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
        from hypothesis.stateful import get_state_machine_test

        from strategies.machine import VIOLATIONS, MachineSettings, SchedulerContractMachine

        o = self.options
        machine_settings = MachineSettings(
            mode=o.mode, configs=o.configs if o.configs is not None else _default_configs(
                o.pcp_sizes, o.cudagraph_modes),
            stages=o.stages, extra_checks=tuple(o.extra_checks),
            violations=o.violations if o.violations is not None else VIOLATIONS,
            on_step=self._on_step, on_teardown=self._on_teardown, stopped=self.stopped)
        machine = SchedulerContractMachine.bind(machine_settings)
        database = o.database if isinstance(o.database, ExampleDatabase) else (
            DirectoryBasedExampleDatabase(str(o.database)) if o.database else None)
        key = f"simrig-fuzz:{o.mode}:{','.join(map(str, o.pcp_sizes))}:{','.join(o.cudagraph_modes)}".encode()
        while not self.stopped():
            self.between_chunks()
            chunk = self.stats.chunks
            self.stats.chunks += 1
            self._chunk_failed = False
            phases = [Phase.generate, Phase.target, Phase.shrink]
            if chunk == 0 and database is not None:
                phases.insert(0, Phase.reuse)  # earlier campaigns' failures first
            hyp = settings(max_examples=o.chunk_examples, deadline=None, database=database,
                           phases=phases, stateful_step_count=o.steps_per_example,
                           suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                           report_multiple_bugs=False, print_blob=False)
            test = get_state_machine_test(machine, settings=hyp)
            test._hypothesis_internal_use_seed = o.seed * 1_000_003 + chunk
            test._hypothesis_internal_database_key = key
            try:
                test()
            except Exception as exc:  # noqa: BLE001 -- sorted below
                self._after_failure(exc)
            self.tolerated.update(k for k, c in self.classes.items() if c.steps is not None)
            self.tolerated.update(k for k, c in self.classes.items() if c.first.known)
        if self.interrupted:
            self.stats.stopped_by = "signal"
        elif self._examples_done():
            self.stats.stopped_by = "max_examples"

    def between_chunks(self) -> None:
        """Hook before each Hypothesis run: the only time the tolerated classes
        may change (mid-run it would make Hypothesis' replays inconsistent)."""

    def _after_failure(self, exc: BaseException) -> None:
        """Hypothesis re-raises the shrunk example's error (or a Flaky one after
        we stopped mid-shrink). Our own findings are already recorded; anything
        else is a bug in the rig."""
        from hypothesis.errors import Flaky

        from strategies.machine import NewFinding

        errors = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else [exc]
        for err in errors:
            if isinstance(err, NewFinding) or (isinstance(err, Flaky) and self.stopped()):
                continue
            self._rig_error(err, "machine")
            self.interrupted = True  # a rig bug stops the campaign: fix it first

    # ------------------------------------------------------------ output
    def finish(self) -> None:
        """Shrunk traces, report, campaign figures and JUnit XML; runs in
        ``finally`` so an interrupted campaign still leaves everything found.

        Everything is built in a staging directory next to OUT and swapped in
        with one rename: OUT is either the complete report (tables, HTML,
        ``shrunk/``, ``junit.xml``) or the earlier one, never half of each.
        """
        import shutil

        from simrig.campaign.shrink import write_shrunk
        from simrig.report.timing import time_share
        from simrig.report.writer import swap_into_place, write_report

        out = Path(self.options.out_dir)
        staging = out.parent / f".{out.name}-staging"
        shrunk = out.parent / f".{out.name}-shrunk-staging"
        for folder in (staging, shrunk):
            shutil.rmtree(folder, ignore_errors=True)
        shrunk.mkdir(parents=True)
        try:
            for cls in sorted(self.classes.values(), key=lambda c: c.key):
                if cls.steps is not None and not cls.trace_path:
                    self._write_shrunk_guarded(write_shrunk, cls, shrunk)
            summary = self.summary()
            result = self.recorder.result([], list(self.options.pcp_sizes), self.options.stages)
            summary["time_share"] = time_share(result.steps, self.stats.elapsed_s)
            classes = self.class_frame()
            write_report(staging, result.steps, self.findings_frame(), result.contract, summary,
                         extra_tables={"occurrences": result.findings},
                         title=f"simrig fuzz campaign ({self.options.mode})", classes=classes,
                         occurrences=result.findings, headline=self.headline(summary))
            self.report_summary = json.loads((staging / "summary.json").read_text())
            self.report_summary["report"] = str(out)
            self.class_table = classes
            if any(shrunk.iterdir()):
                os.replace(shrunk, staging / "shrunk")
            (staging / "junit.xml").write_text(junit_xml(self), encoding="utf-8")
            swap_into_place(staging, out)
        finally:
            shutil.rmtree(shrunk, ignore_errors=True)
            shutil.rmtree(staging, ignore_errors=True)

    def class_frame(self) -> Any:
        """One row per class (report.classes), reproducer = the shrunk or regression trace."""
        from simrig.campaign.shrink import replay_command_args
        from simrig.report.classes import class_frame

        for stats in self.tally.classes.values():
            for cls in self.classes.values():
                if tuple(cls.key[:4]) == (stats.kind, stats.stage, stats.field, stats.exception_type) \
                        and verdict_of(cls.first) == stats.verdict and cls.trace_path:
                    stats.reproducer = Where(cls.trace_path, replay_args=replay_command_args(
                        self.options.stages))
        self.tally.explain(known_lookup())
        return class_frame(self.tally.classes.values())

    def headline(self, s: dict[str, Any]) -> str:
        return (f"fuzz {s['mode']}: {s['examples']:,} examples, {s['steps']:,} steps in "
                f"{s['elapsed_s']:.1f} s ({s['examples_per_s']:.2f} examples/s, "
                f"{s['steps_per_s']:.2f} steps/s), stopped by {s['stopped_by']}; "
                f"{s['regression_traces']} regression trace(s) replayed first; "
                f"{s['loud_rejections']} loud rejections of {s['violations_sent']} violations"
                + graph_line(s))

    def _write_shrunk_guarded(self, write_shrunk: Any, cls: FindingClass, folder: Path) -> None:
        """A shrunk trace whose confirming replay crashes is still written; the
        crash becomes a rig error of the campaign."""
        try:
            write_shrunk(cls, self.options, folder)
        except Exception as exc:  # noqa: BLE001 -- reported, the report is still written
            self._rig_error(exc, "shrink")

    def _rig_error(self, exc: BaseException, check: str) -> None:
        """Record an exception of the campaign's own code as a rig_error class."""
        import traceback

        from simrig.checks.findings import rig_error

        self.stats.rig_errors.append("".join(traceback.format_exception(exc)))
        finding = rig_error(exc, step=self.stats.steps, stage="campaign", check=check)
        key = class_key(finding)
        cls = self.classes.get(key)
        if cls is None:
            cls = self.classes[key] = FindingClass(key, finding)
        cls.count += 1

    def exit_status(self) -> int:
        """3 when simrig's own code raised (a rig_error class), else 1 for a
        failing class, else 0 (see simrig.errors)."""
        from simrig.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_RIG_ERROR

        if self.stats.rig_errors or any(c.key[0] == "rig_error" for c in self.classes.values()):
            return EXIT_RIG_ERROR
        return EXIT_FINDINGS if any(c.failing for c in self.classes.values()) else EXIT_CLEAN

    def summary(self) -> dict[str, Any]:
        st, o = self.stats, self.options
        elapsed = max(st.elapsed_s, 1e-9)
        by_kind: dict[str, int] = {}
        for cls in self.classes.values():
            by_kind[cls.key[0]] = by_kind.get(cls.key[0], 0) + cls.count
        return {
            "command": "fuzz", "suite": f"fuzz {o.mode}", "mode": o.mode,
            "vllm_version": getattr(self, "vllm_version", ""), "device": getattr(self, "device", ""), "seed": o.seed, "budget_s": o.budget_s,
            "pcp_sizes": list(o.pcp_sizes), "cudagraph_modes": list(o.cudagraph_modes),
            "stages": list(o.stages),
            "elapsed_s": st.elapsed_s, "stopped_by": st.stopped_by, "chunks": st.chunks,
            "examples": st.examples, "steps": st.steps,
            "steps_by_cudagraph_mode": dict(sorted(st.steps_by_cudagraph_mode.items())),
            "steps_by_dispatched_mode": dict(sorted(st.steps_by_dispatched_mode.items())),
            "examples_per_s": round(st.examples / elapsed, 3),
            "steps_per_s": round(st.steps / elapsed, 3),
            "findings": st.findings, "finding_classes": len(self.classes),
            "failing_classes": sum(c.failing for c in self.classes.values()),
            "loud_rejections": st.loud_rejections, "violations_sent": st.violations_sent,
            "findings_by_kind": dict(sorted(by_kind.items())),
            "regression_traces": st.regression_traces, "regression_steps": st.regression_steps,
            "rig_errors": len(st.rig_errors), "exit_status": self.exit_status(),
            **({"verdict_note": f"{len(st.rig_errors)} rig error(s): a bug in simrig"}
               if st.rig_errors else {}),
        }

    def findings_frame(self) -> Any:
        import pandas as pd

        rows = []
        for cls in sorted(self.classes.values(), key=lambda c: c.key):
            row = cls.first.row()
            row.update(count=cls.count, verdict=verdict_of(cls.first), loud_rejection=cls.loud,
                       failing=cls.failing,
                       source=cls.source, shrunk_trace=cls.trace_path,
                       shrunk_steps=len(cls.steps) if cls.steps is not None else -1,
                       reproduced="" if cls.reproduced is None else str(cls.reproduced),
                       pcp_size=cls.config.pcp_size if cls.config else -1)
            rows.append(row)
        return pd.DataFrame(rows)


def graph_line(summary: dict[str, Any]) -> str:
    """"; steps dispatched to graphs: FULL 1,234, NONE 567, PIECEWISE 890" (empty when unknown)."""
    chosen = summary.get("steps_by_dispatched_mode") or {}
    if not chosen:
        return ""
    return "; steps dispatched to " + ", ".join(f"{mode} {n:,}" for mode, n in chosen.items())


def _default_configs(pcp_sizes: Sequence[int], cudagraph_modes: Sequence[str] = ("NONE",)) -> Any:
    from hypothesis import strategies as st

    from strategies.configs import runner_configs

    return runner_configs(pcp_sizes=st.sampled_from(tuple(pcp_sizes)),
                          cudagraph_modes=st.sampled_from(tuple(cudagraph_modes)))


def _install_signal_handlers(campaign: Campaign) -> dict[int, Any]:
    """First SIGINT/SIGTERM: stop cleanly (rules stop, report is written).
    A second one interrupts at once (the report is still written in finally)."""
    def handler(signum: int, frame: Any) -> None:
        if campaign.interrupted:
            raise KeyboardInterrupt
        campaign.interrupted = True

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    return old


def _restore_signal_handlers(old: dict[int, Any]) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)


def junit_xml(campaign: Campaign) -> str:
    """One testcase per finding class: failure when failing, skipped when known,
    passed (with a note) for loud rejections."""
    from xml.sax.saxutils import escape, quoteattr

    classes = sorted(campaign.classes.values(), key=lambda c: c.key)
    failures = sum(c.failing for c in classes) + len(campaign.stats.rig_errors)
    cases = []
    for cls in classes:
        name = quoteattr(":".join(str(x) for x in cls.key[:4]) + (" (loud rejection)" if cls.loud else ""))
        body = escape(f"{cls.first.one_line()}\ncount={cls.count} trace={cls.trace_path}")
        if cls.failing:
            inner = f'<failure message={quoteattr(cls.first.one_line()[:200])}>{body}</failure>'
        elif cls.first.known:
            inner = f'<skipped message="known finding">{body}</skipped>'
        else:
            inner = f"<system-out>{body}</system-out>"
        cases.append(f'  <testcase classname="simrig.campaign.fuzz.{campaign.options.mode}" name={name} '
                     f'time="0">{inner}</testcase>')
    for i, text in enumerate(campaign.stats.rig_errors):
        cases.append(f'  <testcase classname="simrig.campaign.fuzz.rig" name="rig_error_{i}" time="0">'
                     f'<error message="simrig bug">{escape(text)}</error></testcase>')
    if not cases:
        cases.append(f'  <testcase classname="simrig.campaign.fuzz.{campaign.options.mode}" name="no findings" time="0"/>')
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            f'<testsuite name="simrig fuzz {campaign.options.mode}" tests="{len(cases)}" '
            f'failures="{failures}" time="{campaign.stats.elapsed_s}">\n' + "\n".join(cases)
            + "\n</testsuite>\n")
