"""A ``simrig`` command run with one seeded fault applied first, in a process of its own.

A mutant cannot be taken back, so each run is a process; ``run`` forks it from the test
process's zygote (simrig/supervision/zygote.py: vLLM already loaded) and falls back to a
fresh interpreter (``python -m tests.mutant_cli``) where none serves. Either way the command
sees what ``simrig`` on a command line would: its own stdout, stderr and exit status.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from simrig.supervision import zygote
from simrig.vllm_runtime.mutate import Mutant

ROOT = Path(__file__).resolve().parents[1]
NO_MUTANT = "-"


def main(mutant: str, *argv: str) -> int:
    """Apply ``mutant`` (a catalogue name, a Mutant as JSON, or ``-`` for none), then run
    ``simrig *argv``; a module of its own (not in run's body) so a fork can call it."""
    # here, not at the top: the parent's side (run) never loads vLLM
    from simrig.adapters.runner import load
    from simrig.cli import main as simrig
    from simrig.selftest.catalogue import BY_NAME
    from simrig.vllm_runtime import mutate

    load()
    if mutant != NO_MUTANT:
        mutate.apply(BY_NAME[mutant] if mutant in BY_NAME else Mutant(**json.loads(mutant)))
    return simrig(list(argv))


def run(argv: list[str], mutant: str | Mutant | None = None, *, module: str = "tests.mutant_cli",
        timeout: float = 600) -> subprocess.CompletedProcess:
    """``simrig *argv`` under ``mutant`` (None: unmutated), from the repository root;
    ``module`` names another ``main(mutant, *argv)`` to run in its place."""
    spec = (NO_MUTANT if mutant is None else mutant if isinstance(mutant, str)
            else json.dumps(asdict(mutant)))
    args = [spec, *argv]
    with tempfile.TemporaryDirectory(prefix="simrig-mutant-cli-") as folder:
        exited = zygote.run(module, args, Path(folder), timeout, cwd=ROOT)
    if exited is None:
        return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    if exited.returncode is None:
        raise subprocess.TimeoutExpired([module, *args], timeout, exited.stdout, exited.stderr)
    return subprocess.CompletedProcess([module, *args], exited.returncode, exited.stdout, exited.stderr)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
