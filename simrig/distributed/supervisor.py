"""A campaign that survives what it finds: a forked worker under a supervisor.

vLLM is not exception-safe, and on a CPU its kernels run in Triton's
interpreter, which writes through raw pointers: a fault in vLLM can corrupt
the heap and kill the process (SIGSEGV, SIGABRT), exhaust memory (an OOM
kill) or never return. None of that may cost a campaign what it found:

    supervisor (imports vLLM once, builds no runner: the clean snapshot)
      │ fork ──► worker: the campaign, resumed from the last checkpoint
      │            before each step: the example so far ──► STATE/inflight.pkl
      │            each stage: beat, step, stage        ──► Lifeline (shared page)
      │            a new class, or every CHECKPOINT_S    ──► STATE/checkpoint.pkl
      │            the end: report, summary, JUnit, history, exit status
      ◄── exit status: the campaign's; done
      ◄── a signal, or no beat for step_timeout_s (killed): one ``crash`` finding
          (signal, stage, step, the example's steps as its reproducer) ──► STATE/crashes.pkl;
          fork a new worker, which resumes after the chunk that crashed

A crash class is new (exit 1). Its reproducer is the crashing example up to
the step that died, confirmed by replaying it in a forked child of its own.
After MAX_CRASHES the last worker only writes the report.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simrig import lifeline as lifeline_mod
from simrig.campaign.fuzz import Campaign, CampaignOptions, FindingClass
from simrig.campaign.shrink import class_key
from simrig.findings.classes import Where
from simrig.findings.findings import Finding

CRASH = "crash"  # the finding kind: the worker process died (or hung) in vLLM's code
MAX_CRASHES = 20  # then the last worker only writes the report
CHECKPOINT_S = 10.0  # at most this long between checkpoints at chunk boundaries
DEFAULT_STEP_TIMEOUT_S = 600.0  # no stage opened for this long: the worker hangs
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
        self._classes_changed = False
        self._last_checkpoint = time.perf_counter()
        self._checkpoint_cost = 0.0
        self._restore()

    # ------------------------------------------------------------ resume
    def _restore(self) -> None:
        saved = _load(self.state_dir / "checkpoint.pkl")
        if saved is not None:
            for name in STATE:
                setattr(self, name, saved[name])
            self._regressions_done = saved["regressions_done"]
            self._applied_crashes = saved["applied_crashes"]
        for crash in (_load(self.state_dir / "crashes.pkl") or [])[self._applied_crashes:]:
            self._apply_crash(crash)
            self._applied_crashes += 1

    def _apply_crash(self, crash: dict[str, Any]) -> None:
        """A dead worker's last example as a ``crash`` class (new: it fails the run)."""
        steps, step = crash["steps"], crash["step"]
        ids = tuple(steps[step].num_scheduled_tokens) if 0 <= step < len(steps) else ()
        what = crash["signal"]
        finding = Finding(kind=CRASH, step=max(step, 0), stage=crash["stage"], check="supervisor",
                          req_ids=ids[:8], exception_type=what, trace=f"example-{crash['example']}",
                          message=f"the campaign's worker died ({what}) in "
                                  f"{crash['stage'] or 'an unknown stage'} at step {step} of example "
                                  f"{crash['example']}; simrig started a new worker and went on")
        key = class_key(finding)
        cls = self.classes.get(key)
        if cls is None:
            cls = self.classes[key] = FindingClass(key, finding)
        cls.count += 1
        candidate = FindingClass(key, finding, steps=list(steps[:step + 1]))
        if steps and (cls.steps is None or candidate.size() < cls.size()):
            cls.steps, cls.violations, cls.config = candidate.steps, dict(crash["violations"]), crash["config"]
        self.tolerated.add(key)  # never shrunk by Hypothesis: it would die again
        config = crash["config"]
        self.tally.add(finding, Where(f"example-{crash['example']}", config.pcp_size if config else 1,
                                      elapsed_s=crash["elapsed_s"], example=crash["example"]))
        self.stats.chunks = max(self.stats.chunks, crash["chunks"])  # go on past the chunk that died
        self.stats.crashes += 1
        self.stats.examples += 1
        self.stats.steps += max(step, 0) + 1

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
        lifeline_mod.mark_step(index, self.stats.examples)
        _dump(self.state_dir / "inflight.pkl", {
            "steps": list(machine.steps), "step": index, "config": machine.config,
            "violations": dict(machine.violations), "example": self.stats.examples,
            "chunks": self.stats.chunks, "elapsed_s": round(self._elapsed(), 3)})

    def _notify(self, cls: FindingClass) -> None:
        super()._notify(cls)
        self._classes_changed = True

    def _on_step(self, machine: Any, index: int, step: Any, obs: Any, found: list[Finding]) -> list[Finding]:
        failing = super()._on_step(machine, index, step, obs, found)
        if self._classes_changed:  # a class is never lost: saved before the next step runs
            self.checkpoint()
        return failing

    def between_chunks(self) -> None:
        super().between_chunks()
        if time.perf_counter() - self._last_checkpoint > max(CHECKPOINT_S, 20 * self._checkpoint_cost):
            self.checkpoint()

    def checkpoint(self) -> None:
        start = time.perf_counter()
        state = {name: getattr(self, name) for name in STATE}
        state.update(regressions_done=self._regressions_done,
                     applied_crashes=self._applied_crashes)
        _dump(self.state_dir / "checkpoint.pkl", state)
        self._classes_changed = False
        self._last_checkpoint = time.perf_counter()
        self._checkpoint_cost = self._last_checkpoint - start

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["crashes"] = self.stats.crashes
        return out


# ------------------------------------------------------------------ supervisor side
def run_supervised(options: CampaignOptions, finish: Callable[[Campaign, int], int], *,
                   step_timeout_s: float | None = None) -> int:
    """Run the campaign in forked workers until one ends it; ``finish(campaign,
    status)`` runs in that worker after the report is written (printing,
    history) and returns the exit status."""
    from simrig.adapters.runner import load

    load()  # once, before any fork: every worker starts from this state, no runner built
    timeout = step_timeout_s if step_timeout_s is not None else DEFAULT_STEP_TIMEOUT_S
    out = Path(options.out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    state_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}-supervise-", dir=out.parent))
    line = lifeline_mod.Lifeline()
    crashes: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        while True:
            explore = len(crashes) < MAX_CRASHES
            line.reset()
            sys.stdout.flush()
            sys.stderr.flush()
            relay = _Relay()
            pid = os.fork()
            if pid == 0:  # the worker never returns into the supervisor's code
                try:
                    relay.in_child()
                    _worker(options, state_dir, line, explore, finish, time.monotonic() - started)
                finally:
                    os._exit(3)
            relay.in_parent()
            try:
                how, value = lifeline_mod.wait_child(pid, line, timeout, poll=relay.drain)
            finally:
                relay.close()
            if how == "exit":
                return value
            if not explore:
                print(f"simrig fuzz: the worker writing the report died ({value}); the report "
                      "could not be written", file=sys.stderr)
                from simrig.errors import EXIT_RIG_ERROR

                return EXIT_RIG_ERROR
            crash = _crash_record(state_dir, line.read(), value)
            crashes.append(crash)
            _dump(state_dir / "crashes.pkl", crashes)
            print(f"simrig fuzz: worker died ({value}) in {crash['stage'] or '?'} at step "
                  f"{crash['step']} of example {crash['example']}: recorded as a crash class, "
                  f"starting a new worker ({len(crashes)} crash(es))", file=sys.stderr)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


class _Relay:
    """The worker's stdout and stderr, through pipes into whatever the supervisor's own
    ``sys.stdout`` / ``sys.stderr`` are (a terminal, a file, or a caller's capture)."""

    def __init__(self) -> None:
        self.pipes = {name: os.pipe() for name in ("stdout", "stderr")}

    def in_child(self) -> None:
        for name, (read, write) in self.pipes.items():
            os.close(read)
            setattr(sys, name, open(write, "w", buffering=1, encoding="utf-8", errors="replace"))

    def in_parent(self) -> None:
        for read, write in self.pipes.values():
            os.close(write)
            os.set_blocking(read, False)

    def drain(self) -> None:
        for name, (read, _) in self.pipes.items():
            chunks = []
            while True:
                try:
                    chunk = os.read(read, 1 << 16)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            if chunks:
                stream = getattr(sys, name)
                stream.write(b"".join(chunks).decode("utf-8", "replace"))
                stream.flush()

    def close(self) -> None:
        self.drain()
        for read, _ in self.pipes.values():
            os.close(read)


def _worker(options: CampaignOptions, state_dir: Path, line: lifeline_mod.Lifeline, explore: bool,
            finish: Callable[[Campaign, int], int], elapsed_before: float) -> None:
    """The forked worker's whole life; leaves with os._exit (never returns)."""
    code = 3
    try:
        for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT):
            # a library's fault handler would print a native backtrace per crash and then
            # die anyway: the crash class names signal, stage and step (SIMRIG_SUPERVISE=0
            # runs the campaign in-process, for a debugger or that backtrace)
            signal.signal(sig, signal.SIG_DFL)
        lifeline_mod.install(line)
        campaign = SupervisedCampaign(options, state_dir, explore=explore, elapsed_before=elapsed_before)
        code = finish(campaign, campaign.run())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 -- the worker must leave through os._exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _crash_record(state_dir: Path, reading: lifeline_mod.Reading, what: str) -> dict[str, Any]:
    inflight = _load(state_dir / "inflight.pkl") or {}
    return {"signal": what if not what.startswith("hang") else "hang", "detail": what,
            "stage": reading.stage, "step": inflight.get("step", reading.step),
            "example": inflight.get("example", reading.example), "steps": inflight.get("steps", []),
            "config": inflight.get("config"), "violations": inflight.get("violations", {}),
            "chunks": inflight.get("chunks", 0), "elapsed_s": inflight.get("elapsed_s")}


def _dump(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def _load(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except FileNotFoundError:
        return None
