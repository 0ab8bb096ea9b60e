"""Known findings: documented discrepancies of vLLM, each for a range of releases.

Reads ``reports/baselines/known-findings*.json`` (or the file or folder ``--known``
names through ``SIMRIG_KNOWN``; ``SIMRIG_BASELINES`` moves the default folder) and
matches each finding to an entry by its precise signature (``KnownFindings``);
``validate_known_findings`` names a malformed file before anything runs.

See docs/known-findings.md, 'The files' format' for the keys and the matching rules.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from simrig.errors import UsageError
from simrig.findings.findings import Finding

BASELINE_DIR = Path(os.environ.get("SIMRIG_BASELINES",
                                   Path(__file__).resolve().parents[2] / "reports" / "baselines"))
KNOWN_ENV = "SIMRIG_KNOWN"  # set by --known FILE
KEY_FIELDS = ("kind", "stage", "field", "check")
SIGNATURE_FIELDS = ("expected", "actual", "pattern")  # optional, exact strings
WHEN_KEYS = ("pcp_size", "dcp_size", "num_speculative_tokens", "shard_decode_requests",  # 0/1
             "pp_size")  # run-config conditions
_CLAUSE = re.compile(r"^\s*(>=|<=|==|>|<)\s*(\d+(?:\.\d+){0,2})\s*$")
_NUM_CLAUSE = re.compile(r"^\s*(>=|<=|==|>|<)\s*(\d+)\s*$")
_OPS = {">=": int.__ge__, "<=": int.__le__, "==": int.__eq__, ">": int.__gt__, "<": int.__lt__}


def release_tuple(version: str) -> tuple[int, int, int]:
    """'0.32.0' -> (0, 32, 0); a source checkout '0.34.0.dev12+gabc' -> (0, 34, 0)."""
    parts = re.findall(r"\d+", version.split("+")[0])[:3]
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return nums[0], nums[1], nums[2]


def parse_range(spec: str) -> tuple[tuple[str, tuple[int, int, int]], ...]:
    """'>=0.30,<=0.33' -> ((op, release), ...); ValueError on a bad clause."""
    clauses = []
    for raw in spec.split(","):
        m = _CLAUSE.match(raw)
        if m is None:
            raise ValueError(f"bad version clause {raw.strip()!r} (use e.g. '>=0.30.0,<=0.33.0')")
        clauses.append((m.group(1), release_tuple(m.group(2))))
    return tuple(clauses)


def in_range(version: str, spec: str) -> bool:
    """Whether release ``version`` lies in ``spec`` (comma = and)."""
    v = release_tuple(version)
    ops = {">=": v.__ge__, "<=": v.__le__, "==": v.__eq__, ">": v.__gt__, "<": v.__lt__}
    return all(ops[op](bound) for op, bound in parse_range(spec))


@dataclass(frozen=True)
class KnownFinding:
    kind: str
    stage: str
    field: str
    check: str
    explanation: str
    evidence: str = ""
    versions: str = ""  # a range such as ">=0.30.0,<=0.33.0"; "" = the file's release
    source: str = ""  # "known-findings.json#0": the file and entry
    expected: str | None = None  # the precise signature (docs/known-findings.md); None = any
    actual: str | None = None
    pattern: str | None = None
    when: tuple[tuple[str, str, int], ...] = ()  # (config key, op, number)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.stage, self.field, self.check)

    def applies_to(self, version: str) -> bool:
        return in_range(version, self.versions) if self.versions else False

    def fits(self, finding: Finding, context: dict[str, int] | None) -> bool:
        """Whether ``finding`` (of this entry's key) has the entry's precise
        signature, in a run configuration ``context`` the entry holds for."""
        for name in ("expected", "actual"):
            want = getattr(self, name)
            if want is not None and getattr(finding, name) != want:
                return False
        if self.pattern is not None and not _pattern_fits(self.pattern, finding.extra.get("pattern")):
            return False
        for key, op, bound in self.when:
            have = (context or {}).get(key)
            if have is None or not _OPS[op](int(have), bound):
                return False
        return True


def _pattern_fits(want: str, got: object) -> bool:
    """``want`` exactly, or (ending in ``*``) any pattern with its prefix."""
    if not isinstance(got, str):
        return False
    if want.endswith("*"):
        return got.startswith(want[:-1])
    return got == want


class KnownFindings:
    def __init__(self, entries: list[KnownFinding], vllm_version: str = "", path: str = ""):
        self.entries = entries
        self.vllm_version = vllm_version
        self.path = path
        self._by_key: dict[tuple[str, str, str, str], list[KnownFinding]] = {}
        for e in entries:
            self._by_key.setdefault(e.key, []).append(e)  # file order: the first fitting explains

    def match(self, finding: Finding) -> KnownFinding | None:
        """The first entry of the finding's (kind, stage, field, check): the
        explanation of a class already judged known (reports look it up)."""
        found = self._by_key.get((finding.kind, finding.stage, finding.field, finding.check))
        return found[0] if found else None

    def judge(self, finding: Finding, context: dict[str, int] | None = None) -> KnownFinding | None:
        """The entry that explains ``finding`` precisely, or None (then it is new)."""
        for entry in self._by_key.get((finding.kind, finding.stage, finding.field, finding.check), ()):
            if entry.fits(finding, context):
                return entry
        return None

    def apply(self, findings: list[Finding], context: dict[str, int] | None = None) -> list[Finding]:
        """Mark every finding an entry explains precisely; ``context`` is the
        run configuration (``pcp_size``, ...) that ``when`` conditions read."""
        for f in findings:
            entry = self.judge(f, context)
            if entry is not None:
                f.known = True
                f.known_by = entry.source
        return findings

    def for_version(self, version: str) -> KnownFindings:
        """The entries that apply to release ``version``."""
        return KnownFindings([e for e in self.entries if e.applies_to(version)], version, self.path)

    def __len__(self) -> int:
        return len(self.entries)


def known_findings_path(vllm_version: str) -> Path:
    """Where entries written on ``vllm_version`` alone go."""
    return BASELINE_DIR / f"known-findings-vllm-{vllm_version}.json"


def parse_known_findings(text: str, path: str) -> KnownFindings:
    """Every entry of one file; an entry without a range gets the file's release."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: known findings: invalid JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("findings"), list):
        raise UsageError(f"{path}:1: findings: a known-findings file needs a list of findings")
    file_version = str(doc.get("vllm_version", ""))
    entries = []
    for i, raw in enumerate(doc["findings"]):
        if not isinstance(raw, dict):
            raise UsageError(f"{path}:1: findings[{i}]: must be an object")
        for key in (*KEY_FIELDS, "explanation"):
            if not isinstance(raw.get(key), str):
                raise UsageError(f"{path}:1: findings[{i}].{key}: must be a string")
        versions = raw.get("vllm", f"=={file_version}" if file_version else "")
        if not isinstance(versions, str):
            raise UsageError(f"{path}:1: findings[{i}].vllm: must be a string such as '>=0.30.0'")
        if versions:
            try:
                parse_range(versions)
            except ValueError as exc:
                raise UsageError(f"{path}:1: findings[{i}].vllm: {exc}") from None
        signature = {}
        for key in SIGNATURE_FIELDS:
            if key in raw and not isinstance(raw[key], str):
                raise UsageError(f"{path}:1: findings[{i}].{key}: must be a string")
            signature[key] = raw.get(key)
        entries.append(KnownFinding(raw["kind"], raw["stage"], raw["field"], raw["check"],
                                    raw["explanation"], str(raw.get("evidence", "")), versions,
                                    f"{Path(path).name}#{i}", **signature,
                                    when=_parse_when(raw.get("when", {}), f"{path}:1: findings[{i}].when")))
    return KnownFindings(entries, file_version, path)


def _parse_when(when: object, where: str) -> tuple[tuple[str, str, int], ...]:
    """{"pcp_size": ">=2,<=4"} -> (("pcp_size", ">=", 2), ("pcp_size", "<=", 4))."""
    if not isinstance(when, dict):
        raise UsageError(f"{where}: must be an object such as {{\"pcp_size\": \">=2\"}}")
    out = []
    for key, spec in when.items():
        if key not in WHEN_KEYS:
            raise UsageError(f"{where}.{key}: unknown condition (use one of {', '.join(WHEN_KEYS)})")
        for clause in str(spec).split(","):
            m = _NUM_CLAUSE.match(clause)
            if m is None or not isinstance(spec, str):
                raise UsageError(f"{where}.{key}: bad clause {clause.strip()!r} (use e.g. '>=2')")
            out.append((key, m.group(1), int(m.group(2))))
    return tuple(out)


def known_findings_files() -> tuple[Path, ...]:
    """The files read, in order: ``SIMRIG_KNOWN`` (a file, or a folder of
    ``known-findings*.json``), else the baselines folder."""
    chosen = os.environ.get(KNOWN_ENV)
    folder = BASELINE_DIR
    if chosen:
        path = Path(chosen)
        if path.is_file():
            return (path,)
        if not path.is_dir():
            raise UsageError(f"--known: {path}: no such file or folder")
        folder = path
    return tuple(sorted(folder.glob("known-findings*.json"))) if folder.is_dir() else ()


def load_all_known_findings() -> KnownFindings:
    """Every entry of every known-findings file, files sorted by name."""
    return _load_files(known_findings_files())


@functools.lru_cache(maxsize=None)
def _load_files(paths: tuple[Path, ...]) -> KnownFindings:
    entries: list[KnownFinding] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: known findings: cannot read ({exc})") from None
        entries += parse_known_findings(text, str(path)).entries
    where = str(paths[0]) if len(paths) == 1 else str(paths[0].parent) if paths else str(BASELINE_DIR)
    return KnownFindings(entries, "", where)


def validate_known_findings() -> int:
    """Read every known-findings file now (before vLLM is imported); a
    malformed one is a UsageError naming it. Returns the number of entries."""
    return len(load_all_known_findings())


def load_known_findings(vllm_version: str) -> KnownFindings:
    """The known findings that apply to ``vllm_version`` (empty when none do).

    Cached per set of files and release: a campaign builds a Checker per
    example, and the files do not change during a run."""
    return _for_version(known_findings_files(), vllm_version)


@functools.lru_cache(maxsize=None)
def _for_version(paths: tuple[Path, ...], vllm_version: str) -> KnownFindings:
    return _load_files(paths).for_version(vllm_version)


@functools.lru_cache(maxsize=None)
def installed_vllm_version() -> str:
    """The installed vLLM's version from package metadata, without importing vllm."""
    try:
        return version("vllm")
    except PackageNotFoundError:
        return "unknown"
