"""Where coverage pays: only while vLLM's code runs, and only for the kernel launches
that may still reach something new.

A gated collector traces only the regions that can reach MRV2 code: ``vllm_calls``
(the harness's builds and steps) minus ``rig_work`` (a probe's own bookkeeping), and
a kernel launch only when its ``LaunchSampler`` says so. Both regions nest; the
switches cost two C calls, made only where the wanted state changes.

See docs/coverage.md, 'What it costs' for the regions and the measured cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Switch:
    """The tracing wanted now, as a stack of regions, applied through
    ``pause``/``resume`` (coverage.py's collector) only when it changes."""

    def __init__(self, pause: Callable[[], None], resume: Callable[[], None], gated: bool,
                 arc_count: Callable[[], int]):
        self._pause, self._resume = pause, resume
        self.gated = gated
        self.arc_count = arc_count
        self._wants: list[bool] = []
        self.tracing = True  # coverage.py traces from its start
        self.launches = LaunchSampler()

    def apply(self) -> None:
        want = self._wants[-1] if self._wants else not self.gated
        if want != self.tracing:
            (self._resume if want else self._pause)()
            self.tracing = want

    def push(self, want: bool) -> None:
        self._wants.append(want)
        self.apply()

    def pop(self) -> None:
        self._wants.pop()
        self.apply()


# The switch of the collector running now, if any.
ACTIVE: Switch | None = None


def activate(switch: Switch | None) -> None:
    global ACTIVE
    ACTIVE = switch


class _Region:
    __slots__ = ("want", "switch")

    def __init__(self, want: bool):
        self.want = want
        self.switch: Switch | None = None

    def __enter__(self) -> None:
        self.switch = ACTIVE
        if self.switch is not None:
            self.switch.push(self.want)

    def __exit__(self, *exc: object) -> None:
        if self.switch is not None:
            self.switch.pop()
            self.switch = None


def vllm_calls() -> _Region:
    """A region that runs vLLM's code (a runner's build, a step): traced."""
    return _Region(True)


def rig_work() -> _Region:
    """The rig's own work inside a traced region (a probe's bookkeeping): untraced."""
    return _Region(False)


def launch(kernel: object, run: Callable[[], Any]) -> Any:
    """Run one interpreted kernel launch, traced only if the running collector's
    sampler asks for it; a traced launch tells the sampler whether it added arcs."""
    switch = ACTIVE
    if switch is None or not switch.tracing:
        return run()
    if not switch.launches.wants(kernel):
        switch.push(False)
        try:
            return run()
        finally:
            switch.pop()
    before = switch.arc_count()
    try:
        return run()
    finally:
        switch.launches.traced(kernel, switch.arc_count() > before)


class LaunchSampler:
    """Which interpreted kernel launches are worth tracing.

    The arcs a kernel body can reach are few and are reached early; tracing
    every later launch, program by program, is most of coverage's cost on CPU.
    Per kernel::

        a traced launch adds arcs   -> trace the next launch too
        a traced launch adds none   -> skip 1, then 2, 4, ... up to MAX_SKIP
                                       launches before the next traced one

    A kernel that reaches something new later is seen again at most
    MAX_SKIP launches on, and from then on closely until it is dry again.
    Deterministic: the same launches in the same order are traced the same,
    so a run and its repeat measure the same arcs.
    """

    MAX_SKIP = 32

    def __init__(self) -> None:
        self._skip: dict[object, int] = {}     # launches to skip before the next traced one
        self._backoff: dict[object, int] = {}  # the gap after the next dry traced launch
        self.traced_launches = 0
        self.skipped_launches = 0

    def wants(self, kernel: object) -> bool:
        left = self._skip.get(kernel, 0)
        if left > 0:
            self._skip[kernel] = left - 1
            self.skipped_launches += 1
            return False
        self.traced_launches += 1
        return True

    def traced(self, kernel: object, added_arcs: bool) -> None:
        if added_arcs:
            self._backoff[kernel] = 1
            self._skip[kernel] = 0
        else:
            gap = self._backoff.get(kernel, 1)
            self._skip[kernel] = gap
            self._backoff[kernel] = min(gap * 2, self.MAX_SKIP)
