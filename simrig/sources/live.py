"""Live recording: write a running vLLM deployment's scheduler steps as traces.

vLLM loads ``register`` through its ``vllm.general_plugins`` entry point; with SIMRIG_RECORD
unset it does nothing, otherwise it wraps ``Scheduler.schedule`` and
``Scheduler.update_from_output`` and writes rotating, self-contained trace files
(``LiveRecorder``'s docstring has the settings and the file layout), each new request with
its ``SamplingParams`` as its ``sampling`` object (``simrig.vllm_sampling.from_vllm``). A recorder
error disables recording and never reaches the scheduler. See docs/recording.md, 'Live recording
in your deployment'.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from simrig.step import SYNTH_VOCAB_SIZE, NewRequest, RunnerConfig, Step, block_groups, step_block_ids
from simrig.trace_io.trace import TraceHeader, TraceWriter, step_to_json
from simrig.vllm_parts.scheduler import (
    rejected_from_output,
    runner_config_of,
    scheduler_class,
    step_from_output,
    vllm_version,
)
from simrig.vllm_sampling.from_vllm import recorded_spec

log = logging.getLogger("simrig.sources.live")
ENV_DIR, ENV_MAX_MB, ENV_MAX_FILES = "SIMRIG_RECORD", "SIMRIG_RECORD_MAX_MB", "SIMRIG_RECORD_MAX_FILES"
_instances = itertools.count()
# a deployment's token ids outside the synthetic vocabulary leave their field out
_LIVE_SPEC = functools.partial(recorded_spec, vocab_size=SYNTH_VOCAB_SIZE)


class RunnerMirror:
    """What the runner holds after each step, kept from the Steps alone."""

    def __init__(self) -> None:
        # req_id -> [prompt_len, prefill_len, computed, max_tokens, block ids per group, sampling]
        self.held: dict[str, list[Any]] = {}

    def apply(self, step: Step) -> None:
        for req_id in (*step.finished, *step.preempted):
            self.held.pop(req_id, None)
        for r in step.new_requests:
            self.held[r.req_id] = [r.prompt_len, r.num_prefill_tokens, r.num_computed_tokens,
                                   r.max_tokens, block_groups(r.block_ids), r.sampling]
        for c in step.cached:
            state = self.held.get(c.req_id)
            if state is not None:
                state[2] = c.num_computed_tokens
                if c.new_block_ids:
                    new = block_groups(c.new_block_ids)
                    state[4] += [[] for _ in range(len(new) - len(state[4]))]
                    for held, added in zip(state[4], new):
                        held.extend(added)
        for req_id in step.num_scheduled_tokens:
            state = self.held.get(req_id)
            if state is not None:
                state[2] += step.num_accepted(req_id)

    def resync_step(self) -> Step:
        """Every held request as a new request, nothing scheduled."""
        new = []
        for req_id, (prompt_len, prefill_len, computed, max_tokens, blocks, sampling) in self.held.items():
            # A request past its prefill holds one more token: the last one sampled.
            known = max(prefill_len, computed + 1) if computed >= prefill_len else prefill_len
            new.append(NewRequest(req_id=req_id, prompt_len=prompt_len, num_computed_tokens=computed,
                                  max_tokens=max_tokens,
                                  prefill_len=known if known != prompt_len else None,
                                  block_ids=step_block_ids(blocks), sampling=sampling))
        return Step(new_requests=new)


class RotatingTraceWriter:
    """Size-capped trace parts; each part is a complete, replayable trace."""

    def __init__(self, directory: str | os.PathLike[str], config: RunnerConfig, source: dict,
                 *, max_bytes: int, max_files: int, stem: str):
        self.directory = Path(directory)
        self.config, self.source = config, dict(source)
        self.max_bytes, self.max_files, self.stem = max(max_bytes, 1), max(max_files, 1), stem
        self.mirror = RunnerMirror()
        self.part = 0
        self.parts: list[Path] = []
        self._writer: TraceWriter | None = None
        self._bytes = 0

    def _open(self) -> None:
        source = dict(self.source, part=self.part)
        resync = self.part > 0 and self.mirror.held
        if resync:
            source["resync_step"] = 0
        path = self.directory / f"{self.stem}-{self.part:04d}.jsonl.gz"
        self._writer = TraceWriter(path, TraceHeader(config=self.config, source=source))
        self._bytes = 0
        if resync:
            self._writer.write(self.mirror.resync_step())

    def write(self, step: Step) -> None:
        if self._writer is None:
            self._open()
        assert self._writer is not None
        self._bytes += len(json.dumps(step_to_json(step, self._writer.num_steps),
                                      separators=(",", ":"))) + 1
        self._writer.write(step)
        self.mirror.apply(step)
        if self._bytes >= self.max_bytes:
            self.rotate()

    def rotate(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self.parts.append(self._writer.path)
        self._writer = None
        self.part += 1
        while len(self.parts) > self.max_files:
            self.parts.pop(0).unlink(missing_ok=True)

    close = rotate


class LiveRecorder:
    """Pairs each SchedulerOutput with its update and writes the finished Step.

    Outputs are completed in schedule order (update_from_output is called in
    FIFO order, also with a batch queue); a step whose update never comes is
    written with no rejections when a later one completes.

    Enable in a deployment (simrig installed next to vLLM)::

        SIMRIG_RECORD=/var/tmp/simrig          directory for the trace files
        SIMRIG_RECORD_MAX_MB=64                trace JSON per file (before gzip), then rotate
        SIMRIG_RECORD_MAX_FILES=16             files kept per scheduler (oldest deleted)

    vLLM loads ``simrig.sources.live:register`` through its ``vllm.general_plugins`` entry
    point; with SIMRIG_RECORD unset it does nothing. Otherwise it wraps
    ``Scheduler.schedule`` and ``Scheduler.update_from_output``:

        schedule()            -> SchedulerOutput -> Step (lengths, ids, blocks, drafts)
        update_from_output()  -> drafts rejected this step -> Step complete -> file

    Files: ``<dir>/sched-<pid>-<n>-<part>.jsonl.gz``, each a complete v1 trace that
    appears atomically when it is closed (on rotation and at exit). A part after
    the first starts with a *resync* step: every request the runner holds at that
    point, re-sent as a new request with its num_computed_tokens and blocks and no
    scheduled tokens, so each file replays on its own (header source
    ``"resync_step": 0``). Prompt token ids are never written: traces carry
    lengths only, and replay synthesises ids. Each new request carries its
    SamplingParams as its ``sampling`` object, less what a trace of the synthetic
    vocabulary cannot hold (``recorded_spec``). A recorder error disables
    recording and never reaches the scheduler.
    """

    def __init__(self, writer: RotatingTraceWriter):
        self.writer = writer
        self.pending: OrderedDict[int, Step] = OrderedDict()
        self.live: set[str] = set()  # ids the runner holds: a new request among them is a streaming update

    def on_schedule(self, so: Any) -> None:
        self.pending[id(so)] = step_from_output(so, keep_token_ids=False, live=self.live,
                                                spec_of=_LIVE_SPEC)

    def on_output(self, so: Any, rejected: dict[str, int]) -> None:
        """``rejected``: drafts rejected per request, counted from the
        ModelRunnerOutput *before* update_from_output (which trims the sampled
        lists of stopped requests in place)."""
        key = id(so)
        if key not in self.pending:
            return
        while self.pending:
            k, step = self.pending.popitem(last=False)
            if k == key:
                step.rejected = {r: n for r, n in rejected.items() if n}
                self.writer.write(step)
                return
            self.writer.write(step)

    def close(self) -> None:
        for step in self.pending.values():
            self.writer.write(step)
        self.pending.clear()
        self.writer.close()


def recorder_for(scheduler: Any, directory: str, *, max_mb: float = 64.0, max_files: int = 16) -> LiveRecorder:
    config = runner_config_of(scheduler)
    stem = f"sched-{os.getpid()}-{next(_instances)}"
    source = {"kind": "recorded", "tool": "simrig live", "vllm_version": vllm_version(),
              "workload": "live", "seed": None}
    writer = RotatingTraceWriter(directory, config, source, max_bytes=int(max_mb * 1024 * 1024),
                                 max_files=max_files, stem=stem)
    return LiveRecorder(writer)


def attach(scheduler: Any, recorder: LiveRecorder) -> None:
    """Record one Scheduler instance (wraps its bound methods)."""
    schedule, update = scheduler.schedule, scheduler.update_from_output

    def recorded_schedule(*args: Any, **kwargs: Any) -> Any:
        so = schedule(*args, **kwargs)
        _guard(recorder, scheduler, recorder.on_schedule, so)
        return so

    def recorded_update(so: Any, model_runner_output: Any, *args: Any, **kwargs: Any) -> Any:
        rejected: dict[str, int] = {}
        _guard(recorder, scheduler, _count_rejected, so, model_runner_output, rejected)
        out = update(so, model_runner_output, *args, **kwargs)
        _guard(recorder, scheduler, recorder.on_output, so, rejected)
        return out

    scheduler.schedule = recorded_schedule
    scheduler.update_from_output = recorded_update
    scheduler._simrig_recorder = recorder
    atexit.register(_guard, recorder, scheduler, recorder.close)


def _count_rejected(so: Any, model_runner_output: Any, into: dict[str, int]) -> None:
    into.update(rejected_from_output(so, model_runner_output))


def detach(scheduler: Any) -> None:
    recorder = scheduler.__dict__.pop("_simrig_recorder", None)
    scheduler.__dict__.pop("schedule", None)
    scheduler.__dict__.pop("update_from_output", None)
    if recorder is not None:
        recorder.close()


def _guard(recorder: LiveRecorder, scheduler: Any, fn: Any, *args: Any) -> None:
    if getattr(recorder, "disabled", False):
        return
    try:
        fn(*args)
    except Exception:  # recording must never take the server down
        recorder.disabled = True
        log.exception("simrig live recording disabled after an error")


def register() -> None:
    """``vllm.general_plugins`` entry point: record every Scheduler built in
    this process when SIMRIG_RECORD names a directory."""
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return
    max_mb = float(os.environ.get(ENV_MAX_MB, "64"))
    max_files = int(os.environ.get(ENV_MAX_FILES, "16"))

    cls = scheduler_class()
    if getattr(cls, "_simrig_patched", False):
        return
    original_init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        try:
            attach(self, recorder_for(self, directory, max_mb=max_mb, max_files=max_files))
        except Exception:
            log.exception("simrig live recording could not start")

    cls._simrig_original_init = original_init
    cls.__init__ = __init__
    cls._simrig_patched = True


def unregister() -> None:
    """Undo ``register`` (Schedulers built later are not recorded)."""
    cls = scheduler_class()
    if getattr(cls, "_simrig_patched", False):
        cls.__init__ = cls._simrig_original_init
        del cls._simrig_original_init
        cls._simrig_patched = False
