"""Contract snapshots: the dtypes the installed vLLM actually produces, per stage and field.

A small built-in scenario (fresh prefill, chunked prefill, decode, spec
decode with a rejection, PCP 2) runs through the Harness (``simrig contract
snapshot``, ``simrig.cli.contract_cmd.build_snapshot``); every field of
every stage is recorded with its kind and dtype, next to the dtype the
contract declares (null for fields outside the table):

    {"format": "simrig-contract", "version": 1, "vllm_version": "0.33.0",
     "scenario": "...",
     "stages": {"prepare": {"idx_mapping": {"kind": "torch", "dtype": "int64",
                                            "declared": "torch int64"}, ...}, ...}}

Two snapshots (say, two vLLM versions) are compared with ``diff_snapshots``.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simrig.errors import UsageError
from simrig.observe import POSTPROCESS, StepObs
from simrig.reference.contract import CONTRACT
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step

FORMAT_NAME = "simrig-contract"
FORMAT_VERSION = 1
SCENARIO_CONFIG = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=256,
                               num_speculative_tokens=2, pcp_size=2)
SCENARIO_TEXT = ("fresh prefill + chunked prefill, decode, spec decode with a rejection, decode; "
                 "max_num_reqs=8, max_num_batched_tokens=64, num_speculative_tokens=2, pcp_size=2")


def scenario_steps() -> list[Step]:
    return [
        Step(new_requests=[NewRequest("a", 40), NewRequest("b", 20), NewRequest("c", 5)],
             num_scheduled_tokens={"a": 40, "b": 20, "c": 4}),
        Step(cached=[CachedUpdate("a", 40), CachedUpdate("b", 20), CachedUpdate("c", 4)],
             num_scheduled_tokens={"a": 1, "b": 1, "c": 1}),
        Step(cached=[CachedUpdate("a", 41), CachedUpdate("b", 21), CachedUpdate("c", 5)],
             num_scheduled_tokens={"a": 3, "b": 1, "c": 3}, spec_tokens={"a": 2, "c": 2},
             rejected={"a": 1}),
        Step(cached=[CachedUpdate("a", 43), CachedUpdate("b", 22), CachedUpdate("c", 8)],
             num_scheduled_tokens={"a": 1, "b": 1, "c": 1}),
    ]


def snapshot_from_observations(observations: list[StepObs], vllm_version: str,
                               scenario: str = SCENARIO_TEXT) -> dict[str, Any]:
    """Merge the observed (kind, dtype) of every field over all steps and ranks."""
    seen: dict[str, dict[str, set[tuple[str, str]]]] = {}
    for obs in observations:
        for stage in obs.stages:
            if stage.stage == POSTPROCESS:
                continue  # sampler stand-in output, not the boundary
            fields = seen.setdefault(stage.stage, {})
            for name, f in stage.fields.items():
                fields.setdefault(name, set()).add((f.kind, f.dtype))
    stages: dict[str, Any] = {}
    for stage, fields in seen.items():
        table = CONTRACT.get(stage, {})
        out = {}
        for name in sorted(fields):
            kinds = fields[name] - {("none", "")} or {("none", "")}
            declared = table.get(name)
            out[name] = {"kind": "|".join(sorted({k for k, _ in kinds})),
                         "dtype": "|".join(sorted({d for _, d in kinds})),
                         "declared": None if declared is None else str(declared)}
        stages[stage] = out
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "vllm_version": vllm_version,
            "scenario": scenario, "stages": stages}


def write_snapshot(path: str | os.PathLike[str], snapshot: dict[str, Any]) -> None:
    """Atomic: a failed write leaves no half-written file behind."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".contract-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(snapshot, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a snapshot; UsageError 'FILE:LINE: field: problem' otherwise."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{name}:0: file: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name}:{exc.lineno}: file: invalid JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise UsageError(f"{name}:1: format: not a {FORMAT_NAME} snapshot")
    if doc.get("version") != FORMAT_VERSION:
        raise UsageError(f"{name}:1: version: unsupported {doc.get('version')!r}")
    stages = doc.get("stages")
    if not isinstance(stages, dict):
        raise UsageError(f"{name}:1: stages: must be an object")
    for stage, fields in stages.items():
        if not isinstance(fields, dict):
            raise UsageError(f"{name}:1: stages.{stage}: must be an object")
        for fname, entry in fields.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) \
                    or not isinstance(entry.get("kind"), str):
                raise UsageError(f"{name}:1: stages.{stage}.{fname}: needs string kind and dtype")
    return doc


@dataclass(frozen=True)
class DiffRow:
    stage: str
    field: str
    a: str  # "kind dtype", or "-" when absent
    b: str

    @property
    def dtype_changed(self) -> bool:
        return self.a != self.b


def _entry(doc: dict[str, Any], stage: str, name: str) -> str:
    entry = doc["stages"].get(stage, {}).get(name)
    return "-" if entry is None else f"{entry['kind']} {entry['dtype']}".strip()


def diff_snapshots(a: dict[str, Any], b: dict[str, Any]) -> list[DiffRow]:
    """Every (stage, field) whose kind/dtype differs, or that exists on one side only."""
    rows = []
    for stage in sorted(set(a["stages"]) | set(b["stages"])):
        names = set(a["stages"].get(stage, {})) | set(b["stages"].get(stage, {}))
        for name in sorted(names):
            row = DiffRow(stage, name, _entry(a, stage, name), _entry(b, stage, name))
            if row.dtype_changed:
                rows.append(row)
    return rows
