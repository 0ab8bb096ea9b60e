"""From reached arcs to the report's coverage tables.

Statements, possible arcs and branch points come from coverage.py's own
parser (``coverage.parser.PythonParser``) run on the installed source files;
functions from Python's ``ast`` (a line belongs to the innermost function
whose body holds it). A function is *driven* when the run reached at least
one line of its body: its never-reached lines are listed with their source
and the reason the reviewed list (``unreached.toml``) gives, or none — an
*unexplained* line, a finding of its own kind (``unexplained_coverage``).
"""

from __future__ import annotations

import ast
import hashlib
import os
import pickle
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.coverage.collect import SCOPE, Arc, vllm_root
from simrig.coverage.reasons import Reasons, load_reasons

EXCLUDE = r"(?i)#\s*pragma[:\s]?\s*no\s*cover"

FILE_COLUMNS = ["file", "lines", "lines_reached", "lines_pct", "branches", "branches_reached",
                "branches_pct", "functions_driven"]
FUNCTION_COLUMNS = ["file", "function", "first_line", "lines", "lines_reached", "lines_pct",
                    "branches", "branches_reached", "branches_pct", "unreached", "unexplained"]
UNREACHED_COLUMNS = ["file", "function", "line", "source", "reason", "category", "explained"]
BRANCH_COLUMNS = ["file", "function", "line", "to_line", "reached"]


@dataclass
class FileModel:
    """What can be reached in one source file."""
    path: str  # relative to vLLM's parent folder
    lines: list[str]  # source lines (index 0 = line 1)
    statements: frozenset[int]
    arcs: frozenset[Arc]  # possible arcs (first lines of statements)
    branch_lines: dict[int, frozenset[Arc]]  # line with more than one exit -> its possible arcs
    owner: dict[int, tuple[str, int]]  # statement line -> (function qualname, def line); absent: module level
    parser: Any = field(repr=False, default=None)

    def functions(self) -> dict[str, int]:
        return {name: first for name, first in set(self.owner.values())}


def _model_cache_path(path: Path) -> Path | None:
    """Where the parsed model of ``path`` is kept between processes, keyed by the
    file's size and mtime, coverage.py's and Python's versions and FileModel's
    fields; None when the cache is switched off (SIMRIG_CACHE=none)."""
    import coverage  # lazy: coverage loads only when this runs

    base = os.environ.get("SIMRIG_CACHE") or str(Path(os.environ.get("XDG_CACHE_HOME")
                                                      or Path.home() / ".cache") / "simrig")
    if base == "none":
        return None
    stat = path.stat()
    key = "|".join([str(path), str(stat.st_size), str(stat.st_mtime_ns), coverage.__version__,
                    sys.version, ",".join(f.name for f in fields(FileModel))])
    return Path(base) / "coverage-models" / (hashlib.sha1(key.encode()).hexdigest()[:24] + ".pickle")


@lru_cache(maxsize=256)
def file_model(root: str, rel: str) -> FileModel:
    """The file's model: parsed once per installed file, then read from the cache
    (parsing vLLM's MRV2 package costs a few seconds, which every campaign,
    shard and test process that reports coverage paid at its start)."""
    path = Path(root) / rel
    cached = _model_cache_path(path)
    if cached is not None and cached.exists():
        try:
            with cached.open("rb") as f:
                model = pickle.load(f)
            if isinstance(model, FileModel) and model.path == rel:
                return model
        except Exception:  # noqa: BLE001 - a torn or stale cache file is parsed again
            pass
    model = _parse_file_model(path, rel)
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(tmp, cached)  # atomic: a concurrent reader sees the old or the whole file
        except OSError:
            pass  # a read-only home: parse every time, as before
    return model


def _parse_file_model(path: Path, rel: str) -> FileModel:
    from coverage.parser import PythonParser  # lazy: coverage loads only when this runs

    text = path.read_text(encoding="utf-8")
    parser = PythonParser(text=text, filename=str(path), exclude=EXCLUDE)
    parser.parse_source()
    statements = frozenset(parser.statements)
    arcs = frozenset(parser.arcs())
    exits = parser.exit_counts()
    branch_lines = {line: frozenset(a for a in arcs if a[0] == line)
                    for line, n in exits.items() if n > 1}
    owner: dict[int, tuple[str, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                start = child.body[0].lineno
                if (isinstance(child.body[0], ast.Expr) and isinstance(child.body[0].value, ast.Constant)
                        and isinstance(child.body[0].value.value, str) and len(child.body) > 1):
                    start = child.body[1].lineno  # the docstring is not code
                first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                for line in range(start, (child.end_lineno or start) + 1):
                    if line in statements:
                        owner[line] = (name, first)
                visit(child, name + ".")  # nested functions take their own lines
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(text), "")
    return FileModel(rel, text.splitlines(), statements, arcs, branch_lines, owner, parser)


def reached_lines(model: FileModel, arcs: set[Arc]) -> set[int]:
    lines = {model.parser.first_line(b) for a, b in arcs if b > 0}
    lines |= {model.parser.first_line(a) for a, b in arcs if a > 0}
    return lines & model.statements


def translate(model: FileModel, arcs: set[Arc]) -> set[Arc]:
    return set(model.parser.translate_arcs(arcs))


@dataclass
class CoverageTables:
    files: pd.DataFrame
    functions: pd.DataFrame
    unreached: pd.DataFrame
    branches: pd.DataFrame

    def summary(self) -> dict[str, Any]:
        f = self.functions
        lines, reached = int(f["lines"].sum()), int(f["lines_reached"].sum())
        branches, breached = int(f["branches"].sum()), int(f["branches_reached"].sum())
        files = self.files
        return {
            "driven_functions": len(f),
            "lines": lines, "lines_reached": reached,
            "lines_pct": round(100.0 * reached / lines, 2) if lines else None,
            "branches": branches, "branches_reached": breached,
            "branches_pct": round(100.0 * breached / branches, 2) if branches else None,
            "files": len(files),
            "file_lines": int(files["lines"].sum()) if len(files) else 0,
            "file_lines_reached": int(files["lines_reached"].sum()) if len(files) else 0,
            "unreached_lines": len(self.unreached),
            "unexplained_lines": int((~self.unreached["explained"]).sum()) if len(self.unreached) else 0,
        }


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 2) if whole else None


def analyze(data: Mapping[str, set[Arc]], reasons: Reasons | None = None,
            root: Path | None = None) -> CoverageTables:
    """The four coverage tables of a run (or of merged runs)."""
    root = root if root is not None else vllm_root()
    reasons = reasons if reasons is not None else load_reasons()
    file_rows, fn_rows, miss_rows, branch_rows = [], [], [], []
    for rel in sorted(data):
        if not rel.startswith(SCOPE) or not (root / rel).is_file():
            continue
        model = file_model(str(root), rel)
        arcs = translate(model, set(data[rel]))
        hit = reached_lines(model, arcs)
        by_fn: dict[tuple[str, int], list[int]] = {}
        for line in sorted(model.owner):
            by_fn.setdefault(model.owner[line], []).append(line)
        driven = {key: lines for key, lines in by_fn.items() if any(l in hit for l in lines)}
        all_branches = sum(len(a) for a in model.branch_lines.values())
        file_rows.append({"file": rel, "lines": len(model.statements),
                          "lines_reached": len(hit), "lines_pct": _pct(len(hit), len(model.statements)),
                          "branches": all_branches,
                          "branches_reached": sum(len(a & arcs) for a in model.branch_lines.values()),
                          "branches_pct": None, "functions_driven": len(driven)})
        file_rows[-1]["branches_pct"] = _pct(file_rows[-1]["branches_reached"], all_branches)
        for (name, first), lines in sorted(driven.items(), key=lambda kv: kv[0][1]):
            reached = [l for l in lines if l in hit]
            possible = [a for l in lines if l in model.branch_lines for a in sorted(model.branch_lines[l])]
            taken = [a for a in possible if a in arcs]
            missing = [l for l in lines if l not in hit]
            explained = reasons.explain(rel, name, missing, model.lines)
            for line in missing:
                why = explained.get(line)
                miss_rows.append({"file": rel, "function": name, "line": line,
                                  "source": model.lines[line - 1].rstrip() if line <= len(model.lines) else "",
                                  "reason": why.reason if why else "",
                                  "category": why.category if why else "",
                                  "explained": why is not None})
            for a, b in possible:
                branch_rows.append({"file": rel, "function": name, "line": a, "to_line": b,
                                    "reached": (a, b) in arcs})
            fn_rows.append({"file": rel, "function": name, "first_line": first, "lines": len(lines),
                            "lines_reached": len(reached), "lines_pct": _pct(len(reached), len(lines)),
                            "branches": len(possible), "branches_reached": len(taken),
                            "branches_pct": _pct(len(taken), len(possible)),
                            "unreached": len(missing),
                            "unexplained": sum(1 for l in missing if l not in explained)})
    return CoverageTables(
        pd.DataFrame(file_rows, columns=FILE_COLUMNS),
        pd.DataFrame(fn_rows, columns=FUNCTION_COLUMNS),
        pd.DataFrame(miss_rows, columns=UNREACHED_COLUMNS).astype({"explained": bool}),
        pd.DataFrame(branch_rows, columns=BRANCH_COLUMNS).astype({"reached": bool}))
