"""A campaign that survives what it finds: a forked worker under a supervisor.

``run_supervised`` runs the campaign (``SupervisedCampaign``) in a forked worker
(``simrig.supervision.forked``) that checkpoints what it found; a native crash, an
OOM kill or a hang becomes one ``crash`` finding (``crash_record``, ``apply_crash``)
and a new worker resumes after the chunk that crashed. Before the report, each crash
class's example is shrunk (``simrig.supervision.crash_shrink``).

See docs/fuzz.md, 'The supervisor and its worker'.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simrig import lifeline as lifeline_mod
from simrig.supervision import forked
from simrig.supervision.crash_shrink import shrink_crash_classes
from simrig.campaign.fuzz import Campaign, CampaignOptions, FindingClass
from simrig.campaign.shrink import class_key
from simrig.findings.classes import Where
from simrig.findings.findings import Finding

CRASH = "crash"  # the finding kind: the worker process died (or hung) in vLLM's code
CHECKPOINT_S = 10.0  # at most this long between checkpoints at chunk boundaries
SMALLER_RUN_S = 2.0  # a smaller failing run of a class already saved: checkpointed at most this often
# What a checkpoint holds of a campaign (everything its report is written from).
STATE = ("stats", "classes", "tolerated", "recorder", "tally")


class SupervisedCampaign(Campaign):
    """The campaign inside a worker: resumes, persists, checkpoints."""

    def __init__(self, options: CampaignOptions, state_dir: Path, *, explore: bool = True,
                 elapsed_before: float = 0.0):
        super().__init__(options)
        self.state_dir = Path(state_dir)
        self._explore_allowed = explore
        self._elapsed_before = elapsed_before  # the supervisor's clock: earlier workers' time
        self._regressions_done = False
        self._applied_crashes = 0
        self._new_class = self._smaller_run = False
        self._last_checkpoint = time.perf_counter()
        self._checkpoint_cost = 0.0
        self._restore()

    # ------------------------------------------------------------ resume
    def _restore(self) -> None:
        saved = forked.load(self.state_dir / "checkpoint.pkl")
        if saved is not None:
            for name in STATE:
                setattr(self, name, saved[name])
            self._regressions_done = saved["regressions_done"]
            self._applied_crashes = saved["applied_crashes"]
        for crash in (forked.load(self.state_dir / "crashes.pkl") or [])[self._applied_crashes:]:
            apply_crash(self, crash)
            self._applied_crashes += 1

    # ------------------------------------------------------------ the campaign's hooks
    def _elapsed(self) -> float:
        return self._elapsed_before + super()._elapsed()

    def replay_regressions(self) -> None:
        if not self._regressions_done:
            super().replay_regressions()
        self._regressions_done = True

    def explore(self) -> None:
        if self._explore_allowed:
            super().explore()

    def _stopped_by(self) -> str:
        return super()._stopped_by() if self._explore_allowed else "crashes"

    def _before_step(self, machine: Any, index: int, step: Any) -> None:
        persist_example(self.state_dir / "inflight.pkl", self, machine, index)

    def _notify(self, cls: FindingClass) -> None:
        super()._notify(cls)
        if cls.count == 0 and cls.steps is None:
            self._new_class = True  # first seen (a smaller run of a known one: _smaller_run)
        else:
            self._smaller_run = True

    def _on_step(self, machine: Any, index: int, step: Any, obs: Any, found: list[Finding]) -> list[Finding]:
        failing = super()._on_step(machine, index, step, obs, found)
        # a class is never lost: saved before the next step runs; a smaller failing run of
        # one (Hypothesis shrinking finds many in a row) at most every SMALLER_RUN_S
        if self._new_class or (self._smaller_run
                               and time.perf_counter() - self._last_checkpoint > SMALLER_RUN_S):
            self.checkpoint()
        return failing

    def between_chunks(self) -> None:
        super().between_chunks()
        if time.perf_counter() - self._last_checkpoint > max(CHECKPOINT_S, 20 * self._checkpoint_cost):
            self.checkpoint()

    def finish(self) -> None:
        """Each crash class's example shrunk in forked children (``crash_shrink``), then the
        report; a stopped campaign (Ctrl-C, SIGTERM) writes its report at once."""
        if not self.interrupted:
            try:
                shrink_crash_classes(self)
            except Exception as exc:  # noqa: BLE001 -- a bug in simrig: reported, the report still written
                self.rig_error(exc, "crash_shrink")
        super().finish()

    def checkpoint(self) -> None:
        start = time.perf_counter()
        state = {name: getattr(self, name) for name in STATE}
        state.update(regressions_done=self._regressions_done,
                     applied_crashes=self._applied_crashes)
        forked.dump(self.state_dir / "checkpoint.pkl", state)
        self._new_class = self._smaller_run = False
        self._last_checkpoint = time.perf_counter()
        self._checkpoint_cost = self._last_checkpoint - start


def apply_crash(campaign: Campaign, crash: dict[str, Any]) -> None:
    """A dead worker's last example as a ``crash`` class of ``campaign`` (new: it fails the run);
    ``crash``: signal, stage, step, example, steps, config, violations, chunks, elapsed_s,
    shrink_run."""
    steps, step = crash["steps"], crash["step"]
    ids = tuple(steps[step].num_scheduled_tokens) if 0 <= step < len(steps) else ()
    what = crash["signal"]
    finding = Finding(kind=CRASH, step=max(step, 0), stage=crash["stage"], check="supervisor",
                      req_ids=ids[:8], exception_type=what, trace=f"example-{crash['example']}",
                      message=f"the campaign's worker died ({what}) in "
                              f"{crash['stage'] or 'an unknown stage'} at step {step} of example "
                              f"{crash['example']}; simrig started a new worker and went on")
    key = class_key(finding)
    cls = campaign.classes.get(key)
    if cls is None:
        cls = campaign.classes[key] = FindingClass(key, finding)
    cls.count += 1
    candidate = FindingClass(key, finding, steps=list(steps[:step + 1]))
    if steps and (cls.steps is None or candidate.size() < cls.size()):
        cls.steps, cls.violations, cls.config = candidate.steps, dict(crash["violations"]), crash["config"]
    campaign.tolerated.add(key)  # never shrunk by Hypothesis: it would die again
    config = crash["config"]
    campaign.tally.add(finding, Where(f"example-{crash['example']}", config.pcp_size if config else 1,
                                      elapsed_s=crash["elapsed_s"], example=crash["example"]))
    campaign.stats.chunks = max(campaign.stats.chunks, crash["chunks"])  # go on past the chunk that died
    campaign.stats.crashes += 1
    if crash.get("shrink_run"):  # it died shrinking a failure: no example of its own
        campaign.stats.shrink_runs += 1
    else:
        campaign.stats.examples += 1
    campaign.stats.steps += max(step, 0) + 1


def crash_record(inflight: dict[str, Any], reading: lifeline_mod.Reading, what: str) -> dict[str, Any]:
    """What ``apply_crash`` takes, from the example a worker persisted before its last step
    (``inflight``, written by ``persist_example``) and its lifeline."""
    return {"signal": what, "stage": reading.stage, "step": inflight.get("step", reading.step),
            "example": inflight.get("example", reading.example), "steps": inflight.get("steps", []),
            "config": inflight.get("config"), "violations": inflight.get("violations", {}),
            "chunks": inflight.get("chunks", 0), "elapsed_s": inflight.get("elapsed_s"),
            "shrink_run": inflight.get("shrink_run", False)}


def persist_example(path: Path, campaign: Campaign, machine: Any, index: int) -> None:
    """Before a step runs: the example so far, where a supervisor finds it if the step kills us."""
    lifeline_mod.mark_step(index, campaign.stats.examples)
    forked.dump(path, {
        "steps": list(machine.steps), "step": index, "config": machine.config,
        "violations": dict(machine.violations), "example": campaign.stats.examples,
        "chunks": campaign.stats.chunks, "elapsed_s": round(campaign._elapsed(), 3),
        "shrink_run": campaign._shrink_run(machine)})


# ------------------------------------------------------------------ supervisor side
def run_supervised(options: CampaignOptions, finish: Callable[[Campaign, int], int], *,
                   step_timeout_s: float | None = None) -> int:
    """Run the campaign in forked workers until one ends it; ``finish(campaign,
    status)`` runs in that worker after the report is written (printing,
    history) and returns the exit status."""
    crashes: list[dict[str, Any]] = []

    def work(state_dir: Path, last: bool, elapsed_before: float) -> int:
        campaign = SupervisedCampaign(options, state_dir, explore=not last, elapsed_before=elapsed_before)
        return finish(campaign, campaign.run())

    def on_crash(state_dir: Path, reading: lifeline_mod.Reading, what: str) -> str:
        crash = crash_record(forked.load(state_dir / "inflight.pkl") or {}, reading, forked.crash_kind(what))
        crashes.append(crash)
        forked.dump(state_dir / "crashes.pkl", crashes)
        return f"in {crash['stage'] or '?'} at step {crash['step']} of example {crash['example']}"

    return forked.supervise("fuzz", options.out_dir, work, on_crash, timeout_s=step_timeout_s)
