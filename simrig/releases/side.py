"""One side of a comparison: runs inside that side's venv, driven over stdin.

    driver ──"round K\\n"──► side (python -m simrig.releases.side OUT STAGES TRACE...)
           ◄──"SIMRIG-SIDE {json}\\n"── per round: seconds spent in each stage's real calls,
                                       per trace ("stage<TAB>trace")

Round 1 repeats round 0's value digests to find nondeterministic fields
(unstable.json). Round 0 also writes, under OUT, what this vLLM did on every step:
findings (one row per finding class), the observed dtype contract, a digest
of every field's values per (trace, PCP size, step, stage, rank), and the
stages this release cannot drive. Later rounds only time. The side lives
for the whole comparison, so vLLM is imported once and the rounds of A and B
interleave in the same time window. Only lines starting ``SIMRIG-SIDE`` are
protocol; vLLM may print anything else.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simrig.observe import FieldObs
from simrig.replay import replay_steps
from simrig.trace_io.trace import TraceReader

PREFIX = "SIMRIG-SIDE "
SEP = "\t"  # stage SEP trace: timings are kept per trace so unshared work is never compared
CLASS_KEY = ("kind", "stage", "field", "check", "exception_type")


def digest(fo: FieldObs) -> str:
    """A digest of a field's values that ignores the dtype (a dtype change is
    the contract diff's business): integers and bools as int64, floats as float64."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(fo.shape).encode())
    v = fo.values
    if isinstance(v, np.ndarray):
        arr = v.astype(np.float64 if v.dtype.kind == "f" else np.int64, copy=False)
        h.update(np.ascontiguousarray(arr).tobytes())
    else:
        h.update(repr(v).encode())
    return h.hexdigest()


class SideRun:
    def __init__(self, out: Path, stages: tuple[str, ...], traces: list[str]):
        self.out, self.stages, self.traces = out, stages, traces
        self.first_digests: dict[tuple, str] = {}

    def stability_round(self) -> dict[str, float]:
        """Round 1 repeats round 0's digests: a field whose values differ
        between two runs of the same vLLM (e.g. make_dummy's random request
        ids) is nondeterministic, and its value diff across versions means
        nothing. Writes unstable.json (stage, field pairs)."""
        stage_s, digests = self._replay(collect_values=True)
        unstable = sorted({(k[3], k[5]) for k, d in digests.items()
                           if self.first_digests.get(k, d) != d})
        (self.out / "unstable.json").write_text(json.dumps(unstable) + "\n")
        return stage_s

    def _replay(self, collect_values: bool) -> tuple[dict[str, float], dict[tuple, str]]:
        from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

        api = load()
        stage_s: dict[str, float] = defaultdict(float)
        digests: dict[tuple, str] = {}
        for trace in self.traces:
            reader = TraceReader(trace)
            pcp = reader.header.config.pcp_size
            reader.close()
            for replayed in replay_steps(trace, stages=self.stages, api=api):
                for st in replayed.observation.stages:
                    stage_s[f"{st.stage}{SEP}{trace}"] += st.duration_s
                    if collect_values:
                        rank = -1 if st.rank is None else st.rank
                        for name, fo in st.fields.items():
                            digests[(trace, pcp, replayed.observation.index, st.stage, rank,
                                     name)] = digest(fo)
        return dict(stage_s), digests

    def round(self, collect: bool) -> dict[str, float]:
        """Replay every trace once; seconds per stage (and the tables when ``collect``)."""
        if not collect:  # a timed round
            return self._replay(collect_values=False)[0]
        from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

        api = load()
        stage_s: dict[str, float] = defaultdict(float)
        classes: dict[tuple, dict[str, Any]] = {}
        contract: set[tuple[str, str, str, str]] = set()
        values: list[tuple] = []
        unavailable = []
        for trace in self.traces:
            reader = TraceReader(trace)
            config = reader.header.config
            reader.close()
            unavailable += [{"trace": trace, **item._asdict()} for item in api.unavailable(config)]
            for replayed in replay_steps(trace, stages=self.stages, api=api):
                for st in replayed.observation.stages:
                    stage_s[f"{st.stage}{SEP}{trace}"] += st.duration_s
                    rank = -1 if st.rank is None else st.rank
                    for name, fo in st.fields.items():
                        contract.add((st.stage, name, fo.kind, fo.dtype))
                        key = (trace, config.pcp_size, replayed.observation.index, st.stage,
                               rank, name)
                        self.first_digests[key] = d = digest(fo)
                        values.append((*key, d))
                for f in replayed.findings:
                    key = tuple(getattr(f, k) for k in CLASS_KEY)
                    row = classes.setdefault(key, {**dict(zip(CLASS_KEY, key)), "count": 0,
                                                   "known": f.known, "known_by": f.known_by,
                                                   "first_trace": trace, "first_step": f.step})
                    row["count"] += 1
        self._write(api, classes, contract, values, unavailable)
        return dict(stage_s)

    def _write(self, api: Any, classes: dict, contract: set, values: list,
               unavailable: list) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        cols = [*CLASS_KEY, "count", "known", "known_by", "first_trace", "first_step"]
        pd.DataFrame(list(classes.values()), columns=cols).to_parquet(self.out / "classes.parquet")
        pd.DataFrame(sorted(contract), columns=["stage", "field", "kind", "dtype"]).to_parquet(
            self.out / "contract.parquet")
        pd.DataFrame(values, columns=["trace", "pcp_size", "step", "stage", "rank", "field",
                                      "digest"]).to_parquet(self.out / "values.parquet")
        meta = {"vllm_version": api.version, "device": api.device.type,
                "unavailable": unavailable, "shape": api.shape.describe()}
        (self.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str]) -> int:
    out, stages, traces = Path(argv[0]), tuple(s for s in argv[1].split(",") if s), argv[2:]
    # late-bound: tests monkeypatch runner.load
    from simrig.adapters.runner import VllmApiError, VllmUnavailable, load

    try:
        load()
    except (VllmApiError, VllmUnavailable) as exc:
        print(PREFIX + json.dumps({"error": str(exc)}), flush=True)
        return 2
    side = SideRun(out, stages, traces)
    print(PREFIX + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        k = int(cmd[1])
        try:
            stage_s = side.stability_round() if k == 1 else side.round(collect=k == 0)
        except Exception as exc:  # reported to the driver as one line, never lost
            print(PREFIX + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            return 1
        print(PREFIX + json.dumps({"round": k, "stage_s": stage_s}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
