"""Processes forked from one interpreter that has already loaded vLLM (a zygote).

Importing vLLM costs about 7 CPU-s a process; work that must run in a process of its own
(a selftest mutant lives only in the process that applied it) forks from a zygote instead::

    run ──(JSON line: module, args, stdout, stderr)──► zygote: vLLM loaded, never runs a step
        ◄──(JSON line: the fork's pid)──────────────── │ fork ──► module.main(*args)
        ◄──(JSON line: its exit code, -N: signal N)─── │ fork ──► the next ...

A zygote serves one interpreter, working directory and environment (what vLLM reads when
it loads): asked for another, this process gives its zygote back and starts one for it.
``run`` returns None where no zygote starts (vLLM does not import); the caller then starts
a fresh interpreter, whose error is the one to report.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import IO, NamedTuple

from simrig import lifeline

# The variables that differ from test to test without changing what vLLM loads.
_NOT_PART_OF_THE_KEY = frozenset({"PYTEST_CURRENT_TEST"})


class Exited(NamedTuple):
    """How a forked run ended: its exit code (-N: killed by signal N; None: timed out)."""

    returncode: int | None
    stdout: str
    stderr: str


class _Zygote:
    def __init__(self, key: tuple) -> None:
        self.key = key
        self.proc = subprocess.Popen([sys.executable, "-m", "simrig.supervision.zygote"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=os.environ.copy())
        self.ready = self._line(None) == {"ready": True}

    def _line(self, timeout_s: float | None) -> dict | None:
        """The zygote's next line; None on a timeout or once it is gone."""
        assert self.proc.stdout is not None
        if timeout_s is not None:
            readable, _, _ = select.select([self.proc.stdout], [], [], max(timeout_s, 0.0))
            if not readable:
                return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def run(self, module: str, args: list[str], folder: Path, timeout_s: float,
            cwd: str) -> Exited | None:
        request = {"module": module, "args": args, "cwd": cwd,
                   "stdout": str(folder / "stdout.txt"), "stderr": str(folder / "stderr.txt")}
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        started = self._line(30)
        if not started:
            return None
        ended = self._line(timeout_s)
        timed_out = ended is None and self.proc.poll() is None
        if timed_out:
            os.kill(started["pid"], signal.SIGKILL)
            ended = self._line(30)
        if ended is None:  # the zygote itself is gone
            return None
        read = lambda name: Path(request[name]).read_text(errors="replace") if Path(request[name]).exists() else ""
        return Exited(None if timed_out else ended["code"], read("stdout"), read("stderr"))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]  # the zygote exits on EOF
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


_current: _Zygote | None = None


def run(module: str, args: list[str], folder: Path, timeout_s: float,
        cwd: str | Path | None = None) -> Exited | None:
    """``module.main(*args)``'s exit in a fork of this process's zygote for the current
    environment, run in ``cwd`` (this process's by default), its stdout and stderr kept in
    ``folder``; None where no zygote serves."""
    global _current
    key = (sys.executable, os.getcwd(),
           tuple(sorted((k, v) for k, v in os.environ.items() if k not in _NOT_PART_OF_THE_KEY)))
    if _current is not None and (_current.key != key or _current.proc.poll() is not None):
        _current.close()
        _current = None
    if _current is None:
        _current = _Zygote(key)
        if not _current.ready:
            _current.close()
            _current = None
            return None
    exited = _current.run(module, args, folder, timeout_s, str(cwd or os.getcwd()))
    if exited is None:
        _current.close()
        _current = None
    return exited


@atexit.register
def _close() -> None:
    if _current is not None:
        _current.close()


# ---------------------------------------------------------------- the zygote's side
def _serve(replies: IO[str]) -> int:
    # a Ctrl-C at the terminal is the selftest's to handle; the run in flight gets it as before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        # here, not at the top: the callers' side of this module never loads vLLM
        from simrig.adapters.runner import load

        load()
    except BaseException:  # the caller runs a fresh interpreter, which reports the error
        return 1
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_forked(request)  # never returns
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()
    return 0


def _exit_code(value: object) -> int:
    """What ``sys.exit(value)`` would exit with: None is 0, an int itself, anything else 1
    (``os._exit`` takes only an int: a ``main`` returning None must not fail in the fork)."""
    return 0 if value is None else value if isinstance(value, int) else 1


def _run_forked(request: dict) -> None:
    code = 1
    try:
        lifeline.in_forked_child()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(os.devnull)
        os.chdir(request["cwd"])
        sys.path.insert(0, request["cwd"])  # as ``python -m`` run there finds its modules
        code = _exit_code(importlib.import_module(request["module"]).main(*request["args"]))
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    # the replies go on a descriptor of their own: whatever loading vLLM prints goes to stderr
    _replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.exit(_serve(_replies))
