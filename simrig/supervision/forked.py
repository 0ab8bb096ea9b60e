"""Work that may kill its process, run in forked workers under a supervisor.

A fault in vLLM can kill the process (a corrupted heap, an OOM kill) or never return.
``supervise`` runs the work in a forked worker, relays its output, reads its
lifeline, and starts another when one dies; the state the workers share lives in
a folder (``dump`` / ``load``). ``simrig.supervision.campaign_worker`` and
``simrig.supervision.replay_workers`` use it.

See docs/fuzz.md, 'After a crash: the campaign goes on'.
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
from simrig.errors import EXIT_RIG_ERROR, EXIT_USAGE, UsageError

MAX_CRASHES = 20  # then the last worker only writes the report
DEFAULT_STEP_TIMEOUT_S = 600.0  # no stage opened for this long: the worker hangs
_REFUSED = "refused.pkl"  # a worker's UsageError, raised again by the supervisor
FAULT_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT)


def supervise(command: str, out_dir: Path, work: Callable[[Path, bool, float], int],
              on_crash: Callable[[Path, lifeline_mod.Reading, str], str], *,
              timeout_s: float | None = None, max_crashes: int = MAX_CRASHES) -> int:
    """The exit status of the worker that ended the work. ``on_crash`` returns the
    line stderr says about a crash; a worker that dies as the last one is a rig error::

        supervisor (vLLM imported, no runner built: every worker starts clean)
          │ fork ──► worker: work(state_dir, last, elapsed_before) -> exit status
          │            (stdout / stderr relayed; lifeline: step, unit, stage)
          ◄── an exit status: done
          ◄── a signal, or no beat for timeout_s (killed): on_crash(state_dir,
              reading, what) records it; fork again (``last`` after max_crashes:
              that worker only writes its report)

    ``state_dir`` is removed when the supervisor returns.
    """
    from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

    load()  # once, before any fork: every worker starts from this state
    timeout = timeout_s if timeout_s is not None else DEFAULT_STEP_TIMEOUT_S
    out = Path(out_dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    state_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}-supervise-", dir=out.parent))
    line = lifeline_mod.Lifeline()
    crashes = 0
    started = time.monotonic()
    try:
        while True:
            last = crashes >= max_crashes
            line.reset()
            sys.stdout.flush()
            sys.stderr.flush()
            relay = _Relay()
            pid = os.fork()
            if pid == 0:  # the worker never returns into the supervisor's code
                try:
                    lifeline_mod.in_forked_child()
                    relay.in_child()
                    _worker(work, state_dir, line, last, time.monotonic() - started)
                finally:
                    os._exit(3)
            relay.in_parent()
            try:
                how, value = lifeline_mod.wait_child(pid, line, timeout, poll=relay.drain)
            finally:
                relay.close()
            if how == "exit":
                refused = _refused(state_dir) if value == EXIT_USAGE else None
                if refused is not None:  # the input, refused where vLLM was first asked: one line
                    raise UsageError(refused)
                return value
            if last:
                print(f"simrig {command}: the worker writing the report died ({value}); the "
                      "report could not be written", file=sys.stderr)
                return EXIT_RIG_ERROR
            crashes += 1
            said = on_crash(state_dir, line.read(), value)
            print(f"simrig {command}: worker died ({value}) {said}: recorded as a crash class, "
                  f"starting a new worker ({crashes} crash(es))", file=sys.stderr)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def enabled() -> bool:
    """Supervised unless SIMRIG_SUPERVISE=0 (in this process: a debugger, a profiler, a backtrace)."""
    return os.environ.get("SIMRIG_SUPERVISE", "1") != "0"


def crash_kind(what: str) -> str:
    """The crash class's exception type: the signal's name, or ``hang``."""
    return "hang" if what.startswith("hang") else what


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


def _worker(work: Callable[[Path, bool, float], int], state_dir: Path, line: lifeline_mod.Lifeline,
            last: bool, elapsed_before: float) -> None:
    """The forked worker's whole life; leaves with os._exit (never returns)."""
    code = 3
    try:
        for sig in FAULT_SIGNALS:
            # a library's fault handler would print a native backtrace per crash and then
            # die anyway: the crash class names signal, stage and step
            signal.signal(sig, signal.SIG_DFL)
        lifeline_mod.install(line)
        code = work(state_dir, last, elapsed_before)
    except UsageError as exc:  # bad input found only once vLLM judged it (its own config checks)
        dump(state_dir / _REFUSED, str(exc))
        code = EXIT_USAGE
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 -- the worker must leave through os._exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _refused(state_dir: Path) -> str | None:
    return load(state_dir / _REFUSED)


def dump(path: Path, value: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def load(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except FileNotFoundError:
        return None
