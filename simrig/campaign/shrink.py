"""Shrunk failures as v1 traces, and the replay that confirms them.

Hypothesis shrinks a failing machine example; the campaign keeps the smallest
failing run per finding class (fewest steps, then requests, then tokens).
This module writes that run as a trace whose header says what it reproduces:

    {"format": "simrig-trace", "version": 1, "adversarial": true,
     "source": {"kind": "shrunk", "signature": ["key_error", "gather", "", "KeyError"],
                "loud_rejection": true, "violation_steps": {"0": "unknown_id"}, ...}, ...}

and replays it through a fresh Harness + Checker (+ the campaign's extra
checks) to confirm the same class comes back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simrig import lifeline
from simrig.findings.classes import verdict_of
from simrig.findings.findings import Finding
from simrig.observe import OPTIONAL_STAGES
from simrig.replay import replay_steps
from simrig.trace_io.trace import Expectation, TraceHeader, write_trace


def class_key(finding: Finding) -> tuple[str, str, str, str, bool, str]:
    """Finding class: (kind, stage, field, exception type, loud rejection, verdict).
    The verdict is part of the key: an occurrence a known entry does not match
    forms its own (new) class beside the known one of the same signature."""
    return (*finding.signature, bool(finding.extra.get("loud_rejection")), verdict_of(finding))


def trace_name(key: tuple[str, str, str, str, bool, str]) -> str:
    kind, stage, fld, exc_type, loud = key[:5]
    parts = (kind, stage, fld.replace(".", "_").replace("/", "_"), exc_type, "loud" if loud else "")
    return "-".join(p for p in parts if p)


def write_shrunk(cls: Any, options: Any, staging: Path, *, confirm: bool = True) -> Path:
    """Write a FindingClass's smallest run under STAGING/ (moved to OUT/shrunk/
    with the report) and set ``cls.trace_path`` (its final path); with
    ``confirm``, replay it and set ``cls.reproduced``."""
    header = shrunk_header(cls, options)
    path = Path(staging) / f"{trace_name(cls.key)}.jsonl"
    write_trace(path, header, cls.steps)
    cls.trace_path = str(Path(options.out_dir) / "shrunk" / path.name)
    if confirm and cls.key[0] == "crash":  # it killed a worker: replayed where it can only kill a child
        cls.reproduced = replays_to_a_crash(path, options.stages, cls.key) is not None
    elif confirm:
        found, _ = replay_with_checks(path, options.extra_checks, options.stages)
        cls.reproduced = cls.key in {class_key(f) for f in found}
    return path


def replays_to_a_crash(path: Path, stages: Sequence[str], key: Sequence[Any] = (),
                       timeout_s: float = 300.0) -> lifeline.Reading | None:
    """Does this trace kill (or hang: no stage opened for ``timeout_s``) the process that replays
    it -- given a crash class's ``key``, in its stage by its signal (or a hang)? The dying child's
    last lifeline reading (step, stage), or None. Replayed in a forked child, so the answer
    never costs the caller its own process."""
    sys.stdout.flush()
    sys.stderr.flush()
    line = lifeline.Lifeline()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            lifeline.in_forked_child()
            lifeline.install(line)
            replay_with_checks(path, (), stages)
        except BaseException:  # noqa: BLE001 -- an exception is not a crash
            code = 1
        finally:
            os._exit(code)
    # a supervised worker waiting here is alive: its own supervisor must not take it for hung
    how, what = lifeline.wait_child(pid, line, timeout_s, poll=lambda: lifeline.mark_stage("crash_replay"))
    died = line.read()
    if how != "crash" or (key and (died.stage, what.split(":")[0]) != (key[1], key[3])):
        return None
    return died


def save_regression(cls: Any, options: Any) -> Path:
    """A failing class's shrunk run, into the regressions folder (``--save-regressions``;
    called once the report naming it is in place)."""
    path = Path(options.regressions_dir) / f"{trace_name(cls.key)}.jsonl"
    write_trace(path, shrunk_header(cls, options), cls.steps)
    return path


def shrunk_header(cls: Any, options: Any) -> TraceHeader:
    """The header of a class's shrunk trace: what it must reproduce."""
    kind, stage, fld, exc_type, loud = cls.key[:5]
    # A loud rejection is what the runner must keep doing: the trace says so.
    expect = (Expectation(kind, stage=stage or None, field=fld or None,
                          exception_type=exc_type or None,
                          note="loud rejection of a contract violation (simrig fuzz)"),) if loud else ()
    return TraceHeader(config=cls.config, adversarial=options.mode == "adversarial", expect=expect,
                       source={
        "kind": "shrunk", "tool": "simrig fuzz", "seed": options.seed, "mode": options.mode,
        "signature": list(cls.key[:4]), "loud_rejection": cls.key[4],
        "violation_steps": {str(k): v for k, v in sorted(cls.violations.items())}})


def replay_with_checks(path: str | Path, extra_checks: Sequence[Any] = (),
                       stages: Sequence[str] = OPTIONAL_STAGES,
                       stop: Any = None) -> tuple[list[Finding], int]:
    """Every finding of one trace's replay (``simrig.replay.replay_steps``,
    the same loop ``simrig replay`` runs) and its number of steps; ``stop()``
    true ends it before the next step."""
    found: list[Finding] = []
    count = 0
    for replayed in replay_steps(path, stages=stages, extra_checks=extra_checks, stop=stop):
        found.extend(replayed.findings)
        count += 1
    return found, count


def replay_command_args(stages: Sequence[str]) -> tuple[str, ...]:
    """`simrig replay` flags that run a shrunk trace as the campaign did."""
    return () if tuple(stages) == tuple(OPTIONAL_STAGES) else ("--stages", ",".join(stages))
