"""Progress on stderr while a long run streams steps.

Three modes, chosen once per run:

    tty    one line rewritten in place (carriage return), at most 5 times a second
    plain  one full line every ``interval_s`` seconds (CI logs, pipes)
    quiet  nothing

    replay traces/samples/spec_decode.jsonl pcp=2 | step 1,204 | 48.1 steps/s | findings 3 (2 new)
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

TTY, PLAIN, QUIET = "tty", "plain", "quiet"


class Progress:
    """Rate-limited progress line; ``update`` is cheap enough to call every step."""

    def __init__(self, stream: TextIO | None = None, *, mode: str | None = None,
                 interval_s: float = 10.0, label: str = "replay", total: int | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if mode is None:
            isatty = getattr(self.stream, "isatty", None)
            mode = TTY if isatty is not None and isatty() else PLAIN
        if mode not in (TTY, PLAIN, QUIET):
            raise ValueError(f"progress mode must be tty, plain or quiet, got {mode!r}")
        self.mode = mode
        self.label = label
        self.total = total  # steps expected, when known up front
        # A TTY line is cheap to rewrite; a log line is not.
        self.interval_s = 0.2 if mode == TTY else interval_s
        self.start = time.perf_counter()
        self._last = self.start
        self._where = ""
        self._begun = False
        self._width = 0
        self.steps = 0
        self.findings = 0
        self.new_findings = 0

    def begin(self, where: str) -> None:
        """A new unit of work starts (a trace at one PCP size, a campaign phase)."""
        self._where = where
        if not self._begun:  # rates count from the first unit, not from setup
            self._begun = True
            self.start = self._last = time.perf_counter()
        if self.mode == PLAIN:
            self._emit(force=True)

    def update(self, steps: int, findings: int, new_findings: int) -> None:
        """Totals so far; prints only when the interval has passed."""
        self.steps, self.findings, self.new_findings = steps, findings, new_findings
        if self.mode == QUIET:
            return
        now = time.perf_counter()
        if now - self._last >= self.interval_s:
            self._last = now
            self._emit()

    def close(self) -> None:
        """Print the final totals and leave the cursor on a fresh line."""
        if self.mode == QUIET:
            return
        self._emit(force=True)
        if self.mode == TTY:
            self.stream.write("\n")
            self.stream.flush()

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = self.steps / elapsed
        where = f" {self._where}" if self._where else ""
        of = f"/{self.total:,}" if self.total else ""
        return (f"{self.label}{where} | step {self.steps:,}{of} | {rate:,.1f} steps/s | "
                f"findings {self.findings:,} ({self.new_findings:,} new)")

    def _emit(self, force: bool = False) -> None:
        if self.mode == QUIET:
            return
        text = self.line()
        if self.mode == TTY:
            # Pad over the previous, possibly longer, line.
            pad = " " * max(self._width - len(text), 0)
            self._width = len(text)
            self.stream.write("\r" + text + pad)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
