"""Fuzz campaigns: the stateful scheduler machine against the real runner.

``Campaign`` replays the regression traces, then runs Hypothesis chunks of
``SchedulerContractMachine`` examples until ``--max-examples`` or the budget is spent; a
new finding class fails its example, which Hypothesis shrinks, and the class is
tolerated from the next chunk on. Exit status 1 means a class whose verdict is new
(``simrig.findings.classes.fails_run``). Its other parts live beside it: stopping.py,
corpus.py, steering.py and campaign_report.py in ``simrig/campaign/``.

See docs/fuzz.md, 'How a campaign runs'.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simrig.campaign.axes import AxisState
from simrig.campaign.campaign_report import ReportTables, findings_frame, write_campaign_report
from simrig.campaign.corpus import TraceReplays
from simrig.campaign.options import CampaignOptions, CampaignStats, FindingClass, Key  # noqa: F401 -- re-exported: the campaign's public types
from simrig.campaign.repeatable import seed_only_draws
from simrig.campaign.shrink import class_key
from simrig.campaign.steering import CoverageSteering, plateau
from simrig.campaign.stopping import StopRules
from simrig.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_RIG_ERROR, UsageError
from simrig.findings.classes import ClassTally, Where
from simrig.findings.findings import Finding, rig_error
from simrig.interrupt import StopRequests
from simrig.observe import DISPATCH
from simrig.progress import Progress
from simrig.replay import BatchTracker, ReplayRecorder
from simrig.report.profile import StackSampler
from simrig.runners import shared_pool
from simrig.sampling_checks.seeds import SeedsRecord
from simrig.step import Step
from simrig.trace_io.trace import TraceError
from simrig.vllm_runtime.interpreter_patches import memcheck_ran

IDLE_CHUNKS = 3  # Hypothesis runs in a row without one step: the campaign stops ("idle")
# A steered campaign's Hypothesis runs are this long at least: Hypothesis runs its target
# phase (hill-climbing on target()) once, half-way through a run of fewer than 1,000
# examples, so a 10-example run leaves it no examples to climb with.
STEER_CHUNK_EXAMPLES = 40


class Campaign(StopRules, CoverageSteering, TraceReplays):
    """One fuzz campaign; ``run()`` returns the exit status."""

    def __init__(self, options: CampaignOptions):
        from strategies.machine import MODES  # lazy: strategies brings hypothesis, needed only here

        if options.mode not in MODES:
            raise UsageError(f"--mode: must be one of {', '.join(MODES)}, got {options.mode!r}")
        if options.budget_s is None and options.max_examples is None:
            raise UsageError("a campaign needs a --budget or --max-examples")
        self.options = options
        self.stats = CampaignStats()
        self.classes: dict[Key, FindingClass] = {}
        self.tolerated: set[Key] = set()  # classes already shrunk (or known)
        self.recorder = ReplayRecorder()  # steps rows and dtype tallies, as replay keeps them
        self.tally = ClassTally()  # one row per class for the report (first/last, example, time)
        self.interrupted = False  # a stop was asked for (signal, or a sharded driver)
        self.rig_stopped = False  # simrig's own code raised: the campaign stops
        self.idle = False  # IDLE_CHUNKS Hypothesis runs in a row sent no step
        self.report_summary: dict[str, Any] = {}  # summary.json as written (+ "report")
        self.class_table: Any = None
        self._init_coverage(options)
        self._start = 0.0
        self._chunk_failed = False
        self._progress: Any = None

    # ------------------------------------------------------------ machine hooks
    def _on_step(self, machine: Any, index: int, step: Step, obs: Any,
                 found: list[Finding]) -> list[Finding]:
        st = self.stats
        shrinking = self._shrink_run(machine)
        example = max(st.examples - shrinking, 0)  # a shrink run belongs to the example it shrinks
        run = f"example-{example}" + (f".shrink-{st.shrink_runs}" if shrinking else "")
        st.steps += 1
        st.findings += len(found)
        st.vllm_s += obs.vllm_s if obs is not None else 0.0
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
        st.axes.observe(machine.config, step, machine.__dict__.setdefault("_axis_state", AxisState()),
                        elapsed_s=self._elapsed(), example=example)
        self.recorder.record(run, machine.config.pcp_size, index + 2, step, tracker.observe(step), obs, found)
        seeds = machine.__dict__.setdefault("_seeds", SeedsRecord(machine.config)).observe(index, step, obs)
        seeds.where = Where(run, machine.config.pcp_size, elapsed_s=self._elapsed(), example=example)
        # an example that ends on a finding, or sent an input violation: no solo replays
        seeds.spoilt |= bool(failing := self._judge(found, seeds.where, machine)) or violation is not None
        return failing

    def _judge(self, found: list[Finding], where: Where, machine: Any) -> list[Finding]:
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
        self._chunk_failed |= bool(failing)  # Hypothesis shrinks it: no more examples this run
        self._tick()
        return failing

    def _before_step(self, machine: Any, index: int, step: Step) -> None:
        """Hook before each example step runs (``simrig.supervision.campaign_worker``)."""

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

    def _shrink_run(self, machine: Any) -> bool:
        """Whether ``machine`` is a shrink run: it began after the first failing example of its
        Hypothesis run. With ``report_multiple_bugs`` off Hypothesis generates nothing after
        that failure; every later test case shrinks it or, last, replays the minimal one."""
        return machine.__dict__.setdefault("_shrink_run", self._chunk_failed)

    def _on_teardown(self, machine: Any) -> None:
        if machine.steps:  # only examples that ran a step count (a run that sent none cost nothing)
            if self._shrink_run(machine):
                self.stats.shrink_runs += 1
            else:
                self.stats.examples += 1
            if self.coverage.collector is not None:
                self._coverage_example(machine)
            self._seeds(machine)

    def _seeds(self, machine: Any) -> None:
        # the example's seeded requests replayed alone on its runner, reset (sampling_checks/seeds.py)
        seeds, ms = machine.__dict__.get("_seeds"), machine.machine_settings
        if seeds is not None and seeds.lives() and ms.runners is not None and not self.stopped():
            ms.runners.release(machine.harness)
            machine.harness = None
            if failing := self._judge(seeds.check(ms.runners, ms.stages), seeds.where, machine):
                from strategies.machine import NewFinding  # lazy: strategies brings hypothesis
                raise NewFinding(failing, list(machine.steps), dict(machine.violations), machine.config)

    def _tick(self) -> None:
        if self._progress is not None:
            failing = sum(1 for c in self.classes.values() if c.failing)
            self._progress.label = (f"fuzz {self.options.mode} | example {self.stats.examples:,}"
                                    + (" (shrinking)" if self._chunk_failed else ""))
            self._progress.update(self.stats.steps, len(self.classes), failing)

    # ------------------------------------------------------------ phases
    def run(self) -> int:
        """Regressions, then exploring, then the report. The first SIGINT/SIGTERM
        stops the run at the next step; every later one is ignored (noted on
        stderr) until the report is written."""
        from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

        o = self.options
        api = load()  # the one-off vLLM import (~15 s) is not part of the budget
        self.vllm_version, self.device = api.version, f"{api.device} ({api.platform.mode})"
        self.coverage.start()  # after the import: only what the campaign reaches
        runners_before = _runner_counts()
        sampler = None
        if o.profile:
            sampler = StackSampler().start()
        with StopRequests(on_first=self._interrupt, second_raises=False,
                          note="stopping; the report will hold everything found so far") as stop:
            self._start = time.perf_counter()
            self._progress = Progress(mode=o.progress, label=f"fuzz {o.mode}")
            try:
                if o.replay_regressions:
                    self._progress.begin("regressions")
                    self.replay_regressions()
                if o.steer and o.corpus_dir is not None and Path(o.corpus_dir).is_dir():
                    self._progress.begin("coverage corpus")
                    self.replay_corpus()
                self._progress.begin("campaign")
                self.explore()
            except (UsageError, TraceError):
                self._progress.close()
                raise  # bad input (exit 2), found before anything was explored
            except Exception as exc:  # noqa: BLE001 -- a bug in simrig: reported, report still written
                self.rig_error(exc, "campaign")
                self.rig_stopped = True
            with stop.shield():
                self.coverage.stop()
                self.stats.stopped_by = self._stopped_by()
                self.stats.elapsed_s = round(self._elapsed(), 3)
                self._progress.close()
                self.stats.runners = {k: n - runners_before[k] for k, n in _runner_counts().items()}
                if sampler is not None:
                    sampler.stop()  # the report is not part of the campaign's profile
                self.finish()
                if sampler is not None:
                    self._write_profile(sampler)
        return self.exit_status()

    def _write_profile(self, sampler: Any) -> None:
        out = Path(self.options.out_dir)
        if out.is_dir():
            sampler.write(out / "profile")
            self.report_summary["profile"] = sampler.split()

    def explore(self) -> None:
        # lazy: hypothesis loads only when this runs
        from hypothesis import HealthCheck, Phase, Verbosity, settings
        from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
        from hypothesis.stateful import get_state_machine_test

        # lazy: strategies brings hypothesis, needed only here
        from strategies.machine import VIOLATIONS, MachineSettings, SchedulerContractMachine

        o = self.options
        machine_settings = MachineSettings(
            mode=o.mode, configs=o.configs if o.configs is not None else _default_configs(
                o.pcp_sizes, o.cudagraph_modes),
            stages=o.stages, extra_checks=tuple(o.extra_checks),
            violations=o.violations if o.violations is not None else VIOLATIONS,
            on_step=self._on_step, on_teardown=self._on_teardown, stopped=self.stopped,
            before_step=self._before_step, runners=shared_pool())
        machine = SchedulerContractMachine.bind(machine_settings)
        database = o.database if isinstance(o.database, ExampleDatabase) else (
            DirectoryBasedExampleDatabase(str(o.database)) if o.database else None)
        key = f"simrig-fuzz:{o.mode}:{','.join(map(str, o.pcp_sizes))}:{','.join(o.cudagraph_modes)}".encode()
        idle = 0
        while self._explore_more():
            self.between_chunks()
            chunk = self.stats.chunks
            self.stats.chunks += 1
            self._chunk_failed = False
            phases = [Phase.generate, Phase.target, Phase.shrink]
            if chunk == 0 and database is not None:
                phases.insert(0, Phase.reuse)  # earlier campaigns' failures first
            chunk_examples = max(o.chunk_examples, STEER_CHUNK_EXAMPLES) if o.steer else o.chunk_examples
            hyp = settings(max_examples=chunk_examples, deadline=None, database=database,
                           phases=phases, stateful_step_count=o.steps_per_example,
                           suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                           report_multiple_bugs=False, print_blob=False)
            test = get_state_machine_test(machine, settings=hyp)
            test._hypothesis_internal_use_seed = o.seed * 1_000_003 + chunk
            test._hypothesis_internal_database_key = key
            before = self.stats.steps
            try:
                with seed_only_draws():  # the same examples in every process (repeatable.py)
                    test()
            except Exception as exc:  # noqa: BLE001 -- sorted below
                self._after_failure(exc)
            self.tolerated.update(k for k, c in self.classes.items() if c.steps is not None or c.first.known)
            idle = idle + 1 if self.stats.steps == before else 0
            if idle >= IDLE_CHUNKS:  # the machine sends no steps: more runs would not either
                self.idle = True

    def between_chunks(self) -> None:
        """Hook before each Hypothesis run: the only time the tolerated classes
        may change (mid-run it would make Hypothesis' replays inconsistent)."""

    def _after_failure(self, exc: BaseException) -> None:
        """Hypothesis re-raises the shrunk example's error (or a Flaky one after
        we stopped mid-shrink). Our own findings are already recorded; anything
        else is a bug in the rig, which stops the campaign (fix it first)."""
        from hypothesis.errors import Flaky  # lazy: hypothesis loads only when this runs

        from strategies.machine import NewFinding  # lazy: strategies brings hypothesis, needed only here

        errors = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else [exc]
        for err in errors:
            if isinstance(err, NewFinding) or (isinstance(err, Flaky) and self.stopped()):
                continue
            self.rig_error(err, "machine")
            self.rig_stopped = True

    # ------------------------------------------------------------ output
    def finish(self) -> None:
        """Shrunk traces, report and JUnit XML, swapped into OUT whole
        (simrig.campaign.campaign_report); runs after an interrupted run too."""
        write_campaign_report(self, confirm=True)

    def report_tables(self) -> Any:
        result = self.recorder.result([], list(self.options.pcp_sizes), self.options.stages)
        return ReportTables(result.steps, result.findings, result.contract, self.stats.elapsed_s,
                            title=f"simrig fuzz campaign ({self.options.mode})", vllm_s=self.stats.vllm_s)

    def rig_error(self, exc: BaseException, check: str) -> None:
        """Record an exception of the campaign's own code as a rig_error class
        (in the class table too: it fails the run with exit 3)."""
        self.stats.rig_errors.append("".join(traceback.format_exception(exc)))
        finding = rig_error(exc, step=self.stats.steps, stage="campaign", check=check)
        self.tally.add(finding, Where("campaign", elapsed_s=self._elapsed() if self._start else None,
                                      example=self.stats.examples))
        key = class_key(finding)
        cls = self.classes.setdefault(key, FindingClass(key, finding))
        cls.count += 1
        self._notify(cls)

    def exit_status(self) -> int:
        """3 when simrig's own code raised (a rig_error class), else 1 for a
        failing class, else 0 (see simrig.errors)."""
        if self.stats.rig_errors or any(c.key[0] == "rig_error" for c in self.classes.values()):
            return EXIT_RIG_ERROR
        if any(c.failing for c in self.classes.values()):
            return EXIT_FINDINGS
        if self.options.fail_on_unexplained_coverage and self.unexplained_lines:
            return EXIT_FINDINGS  # asked for: a never-reached line without a reason fails the run
        return EXIT_CLEAN

    def summary(self) -> dict[str, Any]:
        st, o = self.stats, self.options
        elapsed = max(st.elapsed_s, 1e-9)
        by_kind: dict[str, int] = {}
        for cls in self.classes.values():
            by_kind[cls.key[0]] = by_kind.get(cls.key[0], 0) + cls.count
        reasons = self.not_repeatable()
        return {
            "command": "fuzz", "suite": f"fuzz {o.mode}", "mode": o.mode,
            "vllm_version": getattr(self, "vllm_version", ""), "device": getattr(self, "device", ""),
            "memcheck": memcheck_ran(),  # as it ran in this process, not as the flag asked
            "seed": o.seed, "budget_s": o.budget_s, "max_examples": o.max_examples,
            "pcp_sizes": list(o.pcp_sizes), "cudagraph_modes": list(o.cudagraph_modes),
            "stages": list(o.stages),
            "elapsed_s": st.elapsed_s, "stopped_by": st.stopped_by, "chunks": st.chunks,
            "repeatable": not reasons, "not_repeatable_because": reasons,
            "examples": st.examples, "shrink_runs": st.shrink_runs, "steps": st.steps,
            "steps_by_cudagraph_mode": dict(sorted(st.steps_by_cudagraph_mode.items())),
            "steps_by_dispatched_mode": dict(sorted(st.steps_by_dispatched_mode.items())),
            "examples_per_s": round(st.examples / elapsed, 3), "steps_per_s": round(st.steps / elapsed, 3),
            "findings": st.findings, "finding_classes": len(self.classes),
            "failing_classes": sum(c.failing for c in self.classes.values()),
            "loud_rejections": st.loud_rejections, "violations_sent": st.violations_sent,
            "findings_by_kind": dict(sorted(by_kind.items())),
            "regression_traces": st.regression_traces, "regression_steps": st.regression_steps,
            "rig_errors": len(st.rig_errors), "crashes": st.crashes, "exit_status": self.exit_status(),
            "runners": dict(st.runners), "axes": st.axes.summary(),
            **({"steer": o.steer, "corpus_kept": self.corpus_kept, "corpus_replayed": self.corpus_replayed,
                "coverage_arcs": len(self._seen_arcs), **plateau(self.coverage_timeline)}
               if o.coverage else {}),
            **({"verdict_note": f"{len(st.rig_errors)} rig error(s): a bug in simrig"}
               if st.rig_errors else {}),
        }

    def findings_frame(self) -> Any:
        """One row per class: its first finding, count, verdict and shrunk trace."""
        return findings_frame(self)


def _runner_counts() -> dict[str, int]:
    """Runners built, reused and dropped (not clean after a reset, or tainted: vLLM raised
    in them) in this process so far."""
    stats = shared_pool().stats()
    return {k: stats[k] for k in ("built", "reused", "dropped", "tainted")}


def _default_configs(pcp_sizes: Sequence[int], cudagraph_modes: Sequence[str] = ("NONE",)) -> Any:
    from hypothesis import strategies as st  # lazy: hypothesis loads only when this runs

    from strategies.configs import runner_configs  # lazy: strategies brings hypothesis, needed only here

    return runner_configs(pcp_sizes=st.sampled_from(tuple(pcp_sizes)),
                          cudagraph_modes=st.sampled_from(tuple(cudagraph_modes)))
