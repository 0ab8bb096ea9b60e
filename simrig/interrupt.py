"""Ctrl-C and SIGTERM during a long run: stop, then keep what was found.

    first signal            ──► ``requested`` = True: the run stops at its next
                                check and goes on to write its report
    another, while running  ──► KeyboardInterrupt: abandon the current step at once
                                (the report is still written)
    any, inside ``shield()``──► ignored (one note on stderr): the report being
                                written is not lost

Handlers are installed for the ``with`` block only, and only from the main
thread (elsewhere the block is a no-op and ``requested`` stays False).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    """Signal handling for one run: ``with StopRequests() as stop: ...``.

    ``on_first`` is called once, from the handler, on the first signal (for
    example to tell remote workers to stop); ``second_raises=False`` makes
    later signals only set ``abandon`` instead of raising (for a driver loop
    that polls)."""

    def __init__(self, on_first: Callable[[], None] | None = None, *,
                 second_raises: bool = True, stream: TextIO | None = None,
                 note: str = "stopping; writing what was found (again to abandon the current step)"):
        self.on_first = on_first
        self.second_raises = second_raises
        self.stream = stream if stream is not None else sys.stderr
        self.note = note
        self.requested = False  # a stop was asked for
        self.abandon = False  # asked more than once
        self.signal_name = ""
        self._shielded = 0
        self._old: dict[int, Any] = {}

    # -------------------------------------------------------------- handler
    def _handle(self, signum: int, frame: Any) -> None:
        if self._shielded:
            self._say("still writing the report; it will be complete in a moment")
            return
        if not self.requested:
            self.requested = True
            self.signal_name = signal.Signals(signum).name
            self._say(self.note)
            if self.on_first is not None:
                self.on_first()
            return
        self.abandon = True
        if self.second_raises:
            raise KeyboardInterrupt

    def _say(self, text: str) -> None:
        try:
            print(f"simrig: {text}", file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed stream must not mask the stop
            pass

    # -------------------------------------------------------------- context
    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()

    def request(self) -> None:
        """Ask for a stop from code (the same as a first signal, without the note)."""
        self.requested = True

    @contextmanager
    def shield(self) -> Iterator[None]:
        """Signals are ignored inside: wrap the writing of the report."""
        self._shielded += 1
        try:
            yield
        finally:
            self._shielded -= 1
