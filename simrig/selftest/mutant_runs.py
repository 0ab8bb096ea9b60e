"""``simrig selftest``: would simrig catch the regressions that matter?

For each mutant of the catalogue, a child process applies it to the
installed vLLM, replays the bundled traces, then fuzzes until the first
finding or the budget. A mutant is *detected* when it produces a finding
whose signature the unmutated code does not produce under the same budget.

    parent ── child(baseline) ──> signatures S0 (must hold no new findings)
           ├─ child(mutant 1) ──> first signature not in S0? time, examples
           ├─ child(mutant 2) ──> ...
           └─ scoreboard (CSV, parquet, HTML); exit 1 if any mutant survives
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simrig.errors import UsageError
from simrig.findings.known import installed_vllm_version
from simrig.selftest.catalogue import BY_NAME, CATALOGUE
from simrig.supervision import zygote
from simrig.trace_io.trace import trace_files_in

BASELINE = "baseline"


@dataclass
class ChildResult:
    """What one child process reports (JSON on its result file)."""

    mutant: str
    applied: bool = True
    detected: bool = False
    via: str = ""  # "replay:<trace>" or "fuzz:<mode>"
    phase: str = ""  # which phase detected it: "bundled-traces", "fuzz-valid", "fuzz-adversarial"
    seconds_to_detection: float | None = None
    examples_to_detection: int | None = None
    kind: str = ""
    signature: list[str] = field(default_factory=list)
    shrunk_steps: int | None = None
    shrunk_trace: str = ""
    message: str = ""
    signatures: list[list[str]] = field(default_factory=list)  # all seen (baseline)
    new_findings: int = 0  # baseline only: non-known findings on unmutated code
    elapsed_s: float = 0.0
    error: str = ""
    # baseline with coverage: arcs of vLLM's MRV2 code the unmutated run reached
    # (simrig.coverage.collect.to_jsonable); mutants' code is not the release's, never measured
    coverage: dict[str, list[list[int]]] | None = None
    memcheck: bool | None = None  # its kernels ran under memcheck (None: it never loaded vLLM)


# The phases a mutant can be detected in, in the order a child runs them.
PHASE_TRACES = "bundled-traces"
PHASE_FUZZ = "fuzz-{mode}"


def counts_as_detection(finding: Any, baseline: set[tuple[str, ...]]) -> bool:
    """Is this finding evidence of the mutant?

    Only a finding the unmutated code cannot produce: not a known finding of
    this vLLM version, not a loud rejection (the unmutated runner's expected
    KeyError on contract-violating input), not a rig_error (simrig's own
    bug), and not a class the baseline run showed. Without a baseline run
    (``--skip-baseline``) the first three still hold, so a no-op mutant
    cannot be "detected" by replaying an adversarial trace.
    """
    if finding.known or finding.extra.get("loud_rejection") or finding.kind == "rig_error":
        return False
    return tuple(finding.signature) not in baseline


def baseline_cache(root: Path) -> Path:
    """Where the last baseline run's classes are kept for ``--skip-baseline``."""
    return root / ".cache" / "selftest" / f"baseline-vllm-{installed_vllm_version()}.json"


def bundled_traces(root: Path) -> list[Path]:
    """Regressions first, then samples and the recorded corpus."""
    out: list[Path] = []
    for sub in ("regressions", "samples", "recorded"):
        folder = root / "traces" / sub
        if folder.is_dir():
            out += trace_files_in(folder)  # a killed writer's .tmp-* leftovers are not traces
    return out


def run_child(mutant: str, *, budget_s: float, seed: int, baseline: list[list[str]],
              traces: list[Path], out_dir: Path, timeout_s: float, coverage: bool = False,
              max_examples: int | None = None) -> ChildResult:
    """Run one mutant (or the baseline) in a fresh interpreter; ``coverage`` (the
    baseline only) measures the MRV2 code the unmutated run reaches; ``max_examples``
    bounds the fuzz phase by examples (the valid campaign only) instead of the clock."""
    with tempfile.TemporaryDirectory(prefix="simrig-selftest-") as tmp:
        spec = {"mutant": mutant, "budget_s": budget_s, "seed": seed, "baseline": baseline,
                "traces": [str(t) for t in traces], "out_dir": str(out_dir),
                "coverage": bool(coverage and mutant == BASELINE), "max_examples": max_examples}
        spec_path = Path(tmp) / "spec.json"
        result_path = Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        start = time.monotonic()
        # forked from a zygote that loaded vLLM once (simrig.supervision.zygote); where none
        # serves, a fresh interpreter
        proc = zygote.run("simrig.selftest.child", [str(spec_path), str(result_path)], Path(tmp), timeout_s)
        try:
            if proc is None:
                proc = subprocess.run(
                    [sys.executable, "-m", "simrig.selftest.child", str(spec_path), str(result_path)],
                    capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())
        except subprocess.TimeoutExpired:
            proc = zygote.Exited(None, "", "")
        if proc.returncode is None:
            return ChildResult(mutant=mutant, error=f"child timed out after {timeout_s:.0f} s",
                               elapsed_s=time.monotonic() - start)
        if not result_path.exists() and proc.returncode < 0 and mutant != BASELINE:
            # the mutant killed the process that ran it (heap corruption, a bad pointer): a crash
            # is a finding, as in a supervised campaign or replay (simrig.supervision)
            name = signal.Signals(-proc.returncode).name
            return ChildResult(mutant=mutant, detected=True, via="crash", phase="crash", kind="crash",
                               signature=["crash", "", "", name], elapsed_s=time.monotonic() - start,
                               seconds_to_detection=round(time.monotonic() - start, 1),
                               message=f"the child running the mutant died of {name}")
        if not result_path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return ChildResult(mutant=mutant, error=f"child exited {proc.returncode}: {tail[0]}",
                               elapsed_s=time.monotonic() - start)
        data = json.loads(result_path.read_text())
        return ChildResult(**data)


def scoreboard_rows(results: list[ChildResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        m = BY_NAME.get(r.mutant)
        row = asdict(r)
        row.pop("signatures")
        row.pop("coverage")  # the baseline's arcs go to the coverage tables
        row["signature"] = " / ".join(r.signature)
        row["description"] = m.description if m else "unmutated vLLM"
        row["equivalent"] = bool(m and m.equivalent)
        row["target"] = f"{m.module}.{m.qualname}" if m else ""
        row["control"] = bool(m and m.control)
        if m is None:
            row["status"] = "clean" if r.new_findings == 0 and not r.error else "NOT CLEAN"
        elif r.error or not r.applied:
            row["status"] = "error"
        elif m.control:
            # the no-op edit: a detection would come from the rig, not the mutant
            row["status"] = "CONTROL DETECTED" if r.detected else "control survived"
        elif r.detected:
            row["status"] = "detected"
        else:
            row["status"] = "equivalent" if m.equivalent else "SURVIVED"
        rows.append(row)
    return rows


def select_mutants(names: list[str] | None) -> list[str]:
    if not names:
        return [m.name for m in CATALOGUE]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise UsageError(f"--mutants: unknown mutant(s) {', '.join(unknown)}; "
                         f"`simrig selftest --list` shows the catalogue")
    return names


def scoreboard_classes(rows: list[dict[str, Any]]) -> Any:
    """The scoreboard in the reports' class vocabulary, one row per mutant run:

        detected mutant       -> expected (the class the mutant caused, as simrig must see it)
        equivalent mutant     -> known    (documented blind spot, README)
        survivor, error, unclean baseline, detected control -> new (fails the selftest)

    A clean baseline and a surviving control mutant are no class: their
    absence of one is the point.
    """
    # lazy: findings.classes brings pandas, needed only here
    from simrig.findings.classes import EXPECTED, KNOWN, NEW, ClassStats, Where, class_frame

    out = []
    for row in rows:
        status = row["status"]
        if status in ("clean", "control survived"):
            continue
        verdict = (EXPECTED if status == "detected" else
                   KNOWN if status == "equivalent" else NEW)
        sig = [p for p in str(row.get("signature", "")).split(" / ")] if row.get("signature") else []
        kind, stage, fld, exc = (sig + ["", "", "", ""])[:4]
        stats = ClassStats(kind=kind or f"{row['mutant']} {status}", stage=stage, field=fld,
                           exception_type=exc, verdict=verdict, occurrences=1,
                           checks={row["mutant"]}, message=row.get("message") or row.get("error") or status,
                           explanation=f"{row['mutant']}: {row.get('description', '')} ({status})")
        where = Where(str(row.get("shrunk_trace") or row.get("via") or ""), 1,
                      elapsed_s=row.get("seconds_to_detection"),
                      example=row.get("examples_to_detection"))
        stats.traces[where.trace] = where
        stats.first = stats.last = (where, -1, -1)
        if str(where.trace).endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
            stats.reproducer = where
        out.append(stats)
    return class_frame(out)
