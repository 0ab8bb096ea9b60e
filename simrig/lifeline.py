"""What a supervised worker is doing, readable after it died.

A campaign's forked worker (``simrig.supervision.campaign_worker``) may die with no Python
state left, so it writes its step, example and stage into memory both processes map
(``Lifeline``; ``mark_stage``, ``mark_step``). ``wait_child`` reads how a forked child
ended: its exit status, its signal, or a hang (no new beat for the timeout: killed).

See docs/fuzz.md, 'After a crash: the campaign goes on'.
"""

from __future__ import annotations

import mmap
import os
import signal
import struct
import sys
import time
from typing import Any, NamedTuple

_HEAD = struct.Struct("<Qqq")
_STAGE_BYTES = 32
POLL_S = 0.2  # how often a waiting parent looks at its child
SIZE = _HEAD.size + _STAGE_BYTES


class Reading(NamedTuple):
    beats: int
    step: int
    example: int
    stage: str


class Lifeline:
    """The shared page; the worker writes, the supervisor reads.

    An anonymous shared mmap made before the fork (or a file, for Ray shards)::

        offset  0  beats    u64   bumped at every stage the harness opens
                8  step     i64   the example's step index (-1: between steps)
               16  example  i64   the campaign's example number
               24  stage    32 B  the stage running (ASCII, NUL padded)

    Writing it costs a few stores per stage; with no lifeline installed (every
    process but a supervised worker) ``mark_stage`` is one global lookup.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, fresh: bool = True) -> None:
        if path is None:  # anonymous and shared: a forked child writes, its parent reads
            self._map = mmap.mmap(-1, SIZE)
        else:  # a file: any process on the machine reads it after the writer died (Ray shards)
            with open(path, "a+b") as fh:
                fh.truncate(SIZE)
                self._map = mmap.mmap(fh.fileno(), SIZE)
        if fresh:  # (fresh=False: read what a writer left)
            self.reset()

    def reset(self) -> None:
        self._map[:SIZE] = bytes(SIZE)
        _HEAD.pack_into(self._map, 0, 0, -1, -1)

    def at_step(self, step: int, example: int | None = None) -> None:
        beats, _, current = _HEAD.unpack_from(self._map, 0)
        _HEAD.pack_into(self._map, 0, beats + 1, step, current if example is None else example)

    def stage(self, name: str) -> None:
        beats = int.from_bytes(self._map[0:8], "little")
        self._map[0:8] = (beats + 1).to_bytes(8, "little")
        self._map[_HEAD.size:SIZE] = name.encode("ascii", "replace")[:_STAGE_BYTES].ljust(_STAGE_BYTES, b"\0")

    def read(self) -> Reading:
        beats, step, example = _HEAD.unpack_from(self._map, 0)
        stage = bytes(self._map[_HEAD.size:SIZE]).rstrip(b"\0").decode("ascii", "replace")
        return Reading(beats, step, example, stage)


_current: Lifeline | None = None


def in_forked_child() -> None:
    """What a forked worker does first: torch's intra-op parallelism off. GNU OpenMP's thread
    pool does not survive a fork: where the parent ran one parallel region (any large torch op,
    an earlier test's in the same process), the child blocks for ever in its first one (a
    ``torch.full`` of the logits). One thread runs every op inline, never entering OpenMP; the
    rig's tensors are small. A torch imported only after the fork starts its own pool."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def install(lifeline: Lifeline | None) -> None:
    """This process writes to ``lifeline`` (None: to nothing)."""
    global _current
    _current = lifeline


def mark_stage(name: str) -> None:
    """The harness opens a stage: say so to the supervisor, if there is one."""
    if _current is not None:
        _current.stage(name)


def mark_step(step: int, example: int | None = None) -> None:
    """A step starts (of ``example``: a campaign's example, a replay's unit; None: the same)."""
    if _current is not None:
        _current.at_step(step, example)


def wait_child(pid: int, line: Lifeline, timeout_s: float,
               poll: Any = None) -> tuple[str, Any]:
    """("exit", status) or ("crash", what): a signal, or a hang killed after ``timeout_s``;
    ``poll()`` runs while waiting and once the child is gone (relaying its output)."""
    forward = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def relay(signum: int, _frame: Any) -> None:
        try:
            os.kill(pid, signum)  # the worker's own handler stops the campaign and writes the report
        except ProcessLookupError:
            pass

    for sig in forward:
        signal.signal(sig, relay)
    try:
        beats, beat_at = line.read().beats, time.monotonic()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if poll is not None:
                poll()
            if done:
                if os.WIFSIGNALED(status):
                    return "crash", signal.Signals(os.WTERMSIG(status)).name
                return "exit", os.waitstatus_to_exitcode(status)
            now = line.read().beats
            if now != beats:
                beats, beat_at = now, time.monotonic()
            elif time.monotonic() - beat_at > timeout_s:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "crash", f"hang: no progress for {timeout_s:.0f} s, killed"
            time.sleep(POLL_S)
    finally:
        for sig, handler in forward.items():
            signal.signal(sig, handler)
