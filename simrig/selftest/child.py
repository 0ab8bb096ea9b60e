"""One selftest run in its own interpreter: apply a mutant, then hunt.

    python -m simrig.selftest.child SPEC.json RESULT.json

SPEC holds the mutant name ("baseline" for none), budget, seed, the
baseline's signatures and the bundled traces. The result is a
``simrig.selftest.mutant_runs.ChildResult`` as JSON. The mutant lives only in this
process.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from simrig.coverage.collect import to_jsonable
from simrig.selftest.mutant_runs import BASELINE, PHASE_TRACES, ChildResult, counts_as_detection


def _replay_until_new(result: ChildResult, traces: list[str], known: set[tuple[str, ...]],
                      start: float, collect_all: bool) -> bool:
    """Replay bundled traces (loud rejections marked from each header); stop
    after the first trace that shows a finding class outside ``known``."""
    # late-bound: tests monkeypatch shrink.replay_with_checks
    from simrig.campaign.shrink import replay_with_checks

    for path in traces:
        found, _ = replay_with_checks(path)
        for finding in found:
            sig = finding.signature
            if collect_all:
                # a class the unmutated code shows only as known (a precise signature,
                # findings/known.py) does not excuse a new finding of the same class
                if list(sig) not in result.signatures and not finding.known:
                    result.signatures.append(list(sig))
                # lazy: findings.classes brings pandas, needed only here
                from simrig.findings.classes import fails_run, verdict_of

                result.new_findings += int(fails_run(verdict_of(finding)))
                continue
            if not counts_as_detection(finding, known):
                continue
            result.detected = True
            result.via = f"replay:{Path(path).name}"
            result.phase = PHASE_TRACES
            result.seconds_to_detection = time.monotonic() - start
            result.examples_to_detection = 0
            result.kind = finding.kind
            result.signature = list(sig)
            result.shrunk_steps = finding.step + 1  # the trace prefix that shows it
            result.shrunk_trace = path
            result.message = finding.one_line()
            return True
    return False


def main(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    start = time.monotonic()
    result = ChildResult(mutant=spec["mutant"])
    collector = None
    try:
        # in the try: a failed import is the mutant run's reported error
        from simrig.adapters.runner import load
        from simrig.vllm_runtime.interpreter_patches import memcheck_ran

        load()
        result.memcheck = memcheck_ran()  # as installed, not as SIMRIG_MEMCHECK asked
        if spec.get("coverage") and spec["mutant"] == BASELINE:
            # in the try: a failed import is the mutant run's reported error
            from simrig.coverage.collect import Collector

            collector = Collector()
            collector.start()
        if spec["mutant"] != BASELINE:
            # in the try: a failed import is the mutant run's reported error
            from simrig.selftest.catalogue import BY_NAME
            from simrig.vllm_runtime import mutate

            try:
                mutate.apply(BY_NAME[spec["mutant"]])
            except mutate.MutantError as exc:
                result.applied = False
                result.error = str(exc)
        if result.applied:
            known = {tuple(s) for s in spec["baseline"]}
            collect_all = spec["mutant"] == BASELINE
            found = _replay_until_new(result, spec["traces"], known, start, collect_all)
            remaining = spec["budget_s"] - (time.monotonic() - start)
            if not found and (remaining > 0 or spec.get("max_examples")):
                # in the try: a failed import is the mutant run's reported error
                from simrig.selftest.fuzz_phase import fuzz_until_new

                fuzz_until_new(result, known, remaining, spec["seed"], Path(spec["out_dir"]),
                               start, collect_all, max_examples=spec.get("max_examples"))
    except Exception as exc:  # the scoreboard shows it; the parent goes on
        result.error = f"{type(exc).__name__}: {exc}"
    if collector is not None:
        collector.stop()
        result.coverage = to_jsonable(collector.data())
    result.elapsed_s = time.monotonic() - start
    Path(result_path).write_text(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
