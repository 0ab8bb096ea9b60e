"""Known findings: documented discrepancies of a given vLLM version.

A committed JSON file per version, ``reports/baselines/known-findings-vllm-<version>.json``:

    {"vllm_version": "0.33.0",
     "findings": [{"kind": "dtype_drift", "stage": "dummy", "field": "logits_indices",
                   "check": "parity", "explanation": "one line", "evidence": "where"}]}

A finding whose (kind, stage, field, check) matches an entry is marked
``known=True``: still reported, but separated from new regressions.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from simrig.checks.findings import Finding
from simrig.errors import UsageError

BASELINE_DIR = Path(os.environ.get("SIMRIG_BASELINES",
                                   Path(__file__).resolve().parents[2] / "reports" / "baselines"))
KEY_FIELDS = ("kind", "stage", "field", "check")


@dataclass(frozen=True)
class KnownFinding:
    kind: str
    stage: str
    field: str
    check: str
    explanation: str
    evidence: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.stage, self.field, self.check)


class KnownFindings:
    def __init__(self, entries: list[KnownFinding], vllm_version: str = "", path: str = ""):
        self.entries = entries
        self.vllm_version = vllm_version
        self.path = path
        self._by_key = {e.key: e for e in entries}

    def match(self, finding: Finding) -> KnownFinding | None:
        return self._by_key.get((finding.kind, finding.stage, finding.field, finding.check))

    def apply(self, findings: list[Finding]) -> list[Finding]:
        for f in findings:
            if self.match(f) is not None:
                f.known = True
        return findings

    def __len__(self) -> int:
        return len(self.entries)


def known_findings_path(vllm_version: str) -> Path:
    return BASELINE_DIR / f"known-findings-vllm-{vllm_version}.json"


def parse_known_findings(text: str, path: str) -> KnownFindings:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("findings"), list):
        raise UsageError(f"{path}:1: findings: must be a list")
    entries = []
    for i, raw in enumerate(doc["findings"]):
        if not isinstance(raw, dict):
            raise UsageError(f"{path}:1: findings[{i}]: must be an object")
        for key in (*KEY_FIELDS, "explanation"):
            if not isinstance(raw.get(key), str):
                raise UsageError(f"{path}:1: findings[{i}].{key}: must be a string")
        entries.append(KnownFinding(raw["kind"], raw["stage"], raw["field"], raw["check"],
                                    raw["explanation"], str(raw.get("evidence", ""))))
    return KnownFindings(entries, str(doc.get("vllm_version", "")), path)


@functools.lru_cache(maxsize=None)
def load_known_findings(vllm_version: str) -> KnownFindings:
    """The known findings of ``vllm_version`` (empty when none are documented).

    Cached: a campaign builds a Checker per example, and the baseline file
    does not change during a run."""
    path = known_findings_path(vllm_version)
    if not path.is_file():
        return KnownFindings([], vllm_version)
    return parse_known_findings(path.read_text(encoding="utf-8"), str(path))


@functools.lru_cache(maxsize=None)
def installed_vllm_version() -> str:
    """The installed vLLM's version from package metadata, without importing vllm."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return "unknown"
