"""The one reviewed list of why a line of a driven function is never reached.

``load_reasons`` reads ``simrig/coverage/unreached.toml`` (``SIMRIG_UNREACHED`` points
elsewhere): one ``[[reason]]`` per explained place, matched by source text (``match``:
that line and its block) rather than line numbers, so the list stays valid across
releases; ``Reasons`` answers which unreached lines an entry explains.

See docs/coverage.md, 'Every never-reached line explained'.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from simrig.errors import UsageError

DEFAULT_FILE = Path(__file__).with_name("unreached.toml")
CATEGORIES = ("needs-gpu", "feature-off", "trace-cannot-state", "dead-in-release", "error-path",
              "stand-in", "not-on-this-path", "not-drawn")


@dataclass(frozen=True)
class Reason:
    file: str
    function: str
    match: str | None
    category: str
    reason: str
    index: int  # position in the file (for "which entry")


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


class Reasons:
    def __init__(self, entries: list[Reason], source: str = "") -> None:
        self.entries = entries
        self.source = source
        self._by_fn: dict[tuple[str, str], list[Reason]] = {}
        for e in entries:
            self._by_fn.setdefault((e.file, e.function), []).append(e)

    def explain(self, file: str, function: str, missing: list[int], source: list[str]) -> dict[int, Reason]:
        """line -> the reason explaining it, for the unreached ``missing`` lines."""
        out: dict[int, Reason] = {}
        if not missing:
            return out
        todo = set(missing)
        lo, hi = min(missing), max(missing)
        for e in self._by_fn.get((file, function), []):
            if e.match is None:
                for line in missing:
                    out.setdefault(line, e)
                continue
            for line in range(1, len(source) + 1):
                if e.match not in source[line - 1]:
                    continue
                if line > hi or (line < lo and not _opens_block(source, line, lo)):
                    continue
                block = _block(source, line)
                hit = [l for l in [line, *block] if l in todo]
                for l in hit:
                    out.setdefault(l, e)
        return out


def _opens_block(source: list[str], line: int, target: int) -> bool:
    return target in _block(source, line)


def _block(source: list[str], line: int) -> list[int]:
    """The lines under ``line`` with deeper indentation (its block or continuation)."""
    base = _indent(source[line - 1])
    out = []
    for nxt in range(line + 1, len(source) + 1):
        text = source[nxt - 1]
        if not text.strip() or text.strip().startswith("#"):
            continue
        if _indent(text) <= base:
            break
        out.append(nxt)
    return out


def load_reasons(path: str | Path | None = None) -> Reasons:
    """Parse the list; a malformed one is a UsageError naming file and entry.

    One ``[[reason]]`` table per explained place::

        [[reason]]
        file = "vllm/v1/worker/gpu/model_runner.py"
        function = "GPUModelRunner.prepare_inputs"   # qualname, as the coverage tables print it
        match = "if self.use_pp"                     # optional: a line whose source contains this
        category = "feature-off"                      # see docs/coverage.md for the categories
        reason = "pipeline parallel: the harness runs one PP rank"
    """
    path = Path(path or os.environ.get("SIMRIG_UNREACHED") or DEFAULT_FILE)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such unreached-reasons file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not TOML: {exc}") from None
    entries = []
    for i, item in enumerate(raw.get("reason", [])):
        where = f"{path}: reason #{i}"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: not a table")
        for key in ("file", "function", "reason", "category"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise UsageError(f"{where}: {key}: missing or not a string")
        if item["category"] not in CATEGORIES:
            raise UsageError(f"{where}: category: {item['category']!r} is not one of {', '.join(CATEGORIES)}")
        match = item.get("match")
        if match is not None and (not isinstance(match, str) or not match.strip()):
            raise UsageError(f"{where}: match: must be a non-empty string")
        unknown = set(item) - {"file", "function", "match", "category", "reason"}
        if unknown:
            raise UsageError(f"{where}: unknown key {min(unknown)!r}")
        entries.append(Reason(item["file"], item["function"], match, item["category"], item["reason"], i))
    return Reasons(entries, str(path))
