"""Benchmark runs: run the pytest-benchmark suites, load saved runs, compare sets of saves.

``run_suites`` runs ``tests/bench`` under pytest-benchmark (saved runs under the storage
folder), ``load_run`` reads one run as a table, ``resolve_run`` and ``resolve_side`` turn
a name, a number, a list or a pattern into saved runs, and ``interleave`` runs the
suites under two interpreters in alternating rounds.

See docs/benchmarks.md, 'How simrig bench runs and compares'.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simrig.bench.render import (  # noqa: F401
    compare_html,
    compare_markdown,
    compare_notes,
    extra_markdown,
    format_seconds,
    markdown_table,
    ratio_chart_png,
    run_markdown,
    write_compare,
)
from simrig.bench.saves import (  # noqa: F401
    CANNOT_TELL,
    FASTER,
    NOISE,
    SLOWER,
    STATUS_OK,
    STATUS_ONLY_A,
    STATUS_ONLY_B,
    STATUS_REGRESSED,
    STATUS_UNVERIFIED,
    compare,
    regressions,
    unverified,
)
from simrig.bench.stats import bootstrap_ratio
from simrig.errors import UsageError

SUITE = Path("tests") / "bench"
STAT_FIELDS = ("min", "median", "mean", "stddev", "rounds")
RUN_COLUMNS = ("name", "fullname", "group", *STAT_FIELDS, "extra_info", "data")
PATTERN_CHARS = "*?["


# ------------------------------------------------------------------- running
def repo_root() -> Path | None:
    """The checkout holding tests/bench: the working directory, else the one
    this package was imported from (an editable install)."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (candidate / SUITE).is_dir():
            return candidate
    return None


def default_storage() -> Path:
    return (repo_root() or Path.cwd()) / ".benchmarks"


def pytest_command(*, filter_expr: str | None, save: str | None, storage: Path,
                   json_out: Path | None = None, python: str | None = None,
                   suite: Path = SUITE, extra: Sequence[str] = ()) -> list[str]:
    """The pytest invocation; ``-o addopts=`` drops the project's default
    ``--ignore=tests/bench --benchmark-disable`` so the suites run enabled.
    Raw timings are kept (``--benchmark-save-data``). ``suite``: a folder or
    file of benchmarks (default tests/bench); ``extra``: more pytest options
    (``--benchmark-max-time=0.01`` ...), last so they win."""
    cmd = [python or sys.executable, "-m", "pytest", str(suite), "-o", "addopts=",
           "-p", "no:cacheprovider", "--benchmark-enable", "--benchmark-save-data",
           f"--benchmark-storage=file://{storage.resolve()}", "-q"]
    if filter_expr:
        cmd += ["-k", filter_expr]
    if save:
        cmd.append(f"--benchmark-save={save}")
    if json_out is not None:
        cmd.append(f"--benchmark-json={json_out}")
    return cmd + list(extra)


def run_suites(*, filter_expr: str | None, save: str | None, storage: Path, suite: Path = SUITE,
               extra: Sequence[str] = ()) -> tuple[int, pd.DataFrame | None]:
    """Run the suites in a subprocess; (pytest's exit status, the run's frame)."""
    root = repo_root()
    if root is None:
        raise UsageError(f"{SUITE}: not found in the working directory or the simrig checkout")
    if save is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", save):
        raise UsageError(f"--save {save!r}: use letters, digits, '_', '-', '.' only")
    storage.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="simrig-bench-", suffix=".json")
    os.close(fd)
    try:
        cmd = pytest_command(filter_expr=filter_expr, save=save, storage=storage,
                             json_out=Path(tmp), suite=suite, extra=extra)
        # a parent pytest-xdist worker's variables would make pytest-benchmark in the
        # child think it runs distributed, and disable itself
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        status = subprocess.call(cmd, cwd=root, env=env)
        if status == 5:  # pytest: no tests collected
            raise UsageError(f"--filter {filter_expr!r}: selects no benchmark in {suite}")
        frame = load_run(tmp) if os.path.getsize(tmp) else None
        return status, frame
    finally:
        os.unlink(tmp)


# ------------------------------------------------------------------- loading
def _counter(path: Path) -> int:
    head = path.stem.split("_", 1)[0]
    return int(head) if head.isdigit() else -1


def resolve_run(ref: str, storage: Path) -> Path:
    """A run reference (file path, saved name, number or stem) -> its JSON file."""
    as_path = Path(ref)
    if as_path.is_file():
        return as_path
    saved = sorted(storage.rglob("*.json")) if storage.is_dir() else []
    exact = [p for p in saved if p.stem == ref]
    if ref.isdigit():
        exact += [p for p in saved if _counter(p) == int(ref) and p not in exact]
    if len(exact) == 1:
        return exact[0]
    if len(exact) > 1:
        names = ", ".join(str(p) for p in exact)
        raise UsageError(f"run {ref!r}: ambiguous in {storage}: {names}")
    named = [p for p in saved if "_" in p.stem and p.stem.split("_", 1)[1] == ref]
    if named:
        return max(named, key=lambda p: (_counter(p), p.stat().st_mtime))
    raise UsageError(f"run {ref!r}: no such file, and no saved run of that name or "
                     f"number in {storage}")


def saves_named(path: Path, storage: Path) -> int:
    """How many saved runs share ``path``'s name (``0003_base`` -> ``base``)."""
    if "_" not in path.stem or not storage.is_dir():
        return 1
    name = path.stem.split("_", 1)[1]
    return sum(1 for p in storage.rglob("*.json") if p.stem.split("_", 1)[-1] == name
               and "_" in p.stem)


def resolve_side(spec: str, storage: Path) -> list[Path]:
    """One side of ``--compare``: comma-separated run references; a reference
    with ``*``, ``?`` or ``[`` is a pattern matched against the saved runs'
    stems (``0003_base``) and names (``base``), every match in save order."""
    found: list[Path] = []
    for ref in (r.strip() for r in spec.split(",")):
        if not ref:
            raise UsageError(f"--compare {spec!r}: an empty run name")
        if any(c in ref for c in PATTERN_CHARS) and not Path(ref).is_file():
            saved = sorted(storage.rglob("*.json")) if storage.is_dir() else []
            hits = [p for p in saved if fnmatch.fnmatchcase(p.stem, ref)
                    or ("_" in p.stem and fnmatch.fnmatchcase(p.stem.split("_", 1)[1], ref))]
            if not hits:
                raise UsageError(f"run pattern {ref!r}: matches no saved run in {storage}")
            hits.sort(key=lambda p: (_counter(p), str(p)))
        else:
            hits = [resolve_run(ref, storage)]
        found += [p for p in hits if p not in found]
    return found


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_run(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One saved pytest-benchmark run -> one row per benchmark (times in seconds)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text (not a pytest-benchmark JSON run)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: JSON: {exc.msg}") from None
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list):
        raise UsageError(f"{path}: benchmarks: missing (not a pytest-benchmark JSON run)")
    if not benchmarks:
        raise UsageError(f"{path}: benchmarks: empty (was the run made with --benchmark-disable?)")
    rows = []
    for i, bench in enumerate(benchmarks):
        where = f"{path}: benchmarks[{i}]"
        if not isinstance(bench, dict) or not isinstance(bench.get("name"), str):
            raise UsageError(f"{where}.name: missing or not a string")
        stats = bench.get("stats")
        if not isinstance(stats, dict):
            raise UsageError(f"{where}.stats: missing")
        for key in STAT_FIELDS:
            if not _number(stats.get(key)):
                raise UsageError(f"{where}.stats.{key}: missing or not a number")
        extra = bench.get("extra_info") or {}
        if not isinstance(extra, dict):
            raise UsageError(f"{where}.extra_info: not an object")
        data = stats.get("data")
        raw = [float(x) for x in data] if isinstance(data, list) and all(map(_number, data)) else []
        rows.append({"name": bench["name"], "fullname": str(bench.get("fullname") or bench["name"]),
                     "group": bench.get("group") or "", **{k: stats[k] for k in STAT_FIELDS},
                     "extra_info": extra, "data": raw})
    frame = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    dupes = frame["fullname"][frame["fullname"].duplicated()]
    if len(dupes):
        raise UsageError(f"{path}: benchmarks: {dupes.iloc[0]!r} appears more than once")
    frame.attrs["path"] = str(path)
    return frame


def interleave(python_a: str, python_b: str, rounds: int, *, filter_expr: str | None,
               log: Any = print) -> pd.DataFrame:
    """Run the suites under two interpreters in rounds A, B, A, B ... (the same
    time window, so both see the same load) and compare per-round medians."""
    root = repo_root()
    if root is None:
        raise UsageError(f"{SUITE}: not found in the working directory or the simrig checkout")
    if rounds < 1:
        raise UsageError(f"--rounds: must be >= 1, got {rounds}")
    per_round: dict[str, list[pd.DataFrame]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory(prefix="simrig-bench-interleave-") as tmp:
        for k in range(rounds):
            for side, python in (("a", python_a), ("b", python_b)):
                out = Path(tmp) / f"{side}{k}.json"
                cmd = pytest_command(filter_expr=filter_expr, save=None, storage=Path(tmp) / "s",
                                     json_out=out, python=python)
                status = subprocess.call(cmd, cwd=root, stdout=subprocess.DEVNULL)
                if status not in (0, 1) or not out.is_file() or not out.stat().st_size:
                    raise UsageError(f"--interleave: the suites did not run under {python} "
                                     f"(pytest exit {status})")
                per_round[side].append(load_run(out))
            log(f"bench: round {k + 1}/{rounds} done")
    return interleaved_table(per_round["a"], per_round["b"])


def interleaved_table(rounds_a: list[pd.DataFrame], rounds_b: list[pd.DataFrame]) -> pd.DataFrame:
    """Per benchmark: mean of per-round medians on each side, paired bootstrap ratio B/A."""
    def medians(frames: list[pd.DataFrame]) -> pd.DataFrame:
        return pd.concat([f.set_index("fullname")["median"].rename(i) for i, f in enumerate(frames)],
                         axis=1)

    ma, mb = medians(rounds_a), medians(rounds_b)
    rows = []
    for name in sorted(set(ma.index) & set(mb.index)):
        a, b = ma.loc[name].to_numpy(float), mb.loc[name].to_numpy(float)
        r = bootstrap_ratio(a, b)
        rows.append({"fullname": name, "median_a": float(np.mean(a)), "median_b": float(np.mean(b)),
                     "median_ratio": r.ratio, "ci_low": r.low, "ci_high": r.high,
                     "rounds": r.rounds, "verdict": r.verdict})
    return pd.DataFrame(rows, columns=["fullname", "median_a", "median_b", "median_ratio", "ci_low",
                                       "ci_high", "rounds", "verdict"])


def print_run(*, filter_expr: str | None, save: str | None, storage: Path) -> int:
    """``simrig bench``: run the suites, print the run's tables; 0 when pytest passed, else 1."""
    status, frame = run_suites(filter_expr=filter_expr, save=save, storage=storage)
    if frame is not None:
        print()
        print(run_markdown(frame))
        extra = extra_markdown(frame)
        if extra:
            print()
            print(extra)
    if save and status == 0:
        print(f"saved as {save!r} in {storage}")
    return 0 if status == 0 else 1


def print_compare(spec_a: str, spec_b: str, storage: Path, fail_on_regression: float | None,
                  min_effect: float | None, out: Path) -> int:
    """``simrig bench --compare``: the B/A table of two sets of saves, its files under ``out``;
    1 when a benchmark is slower beyond ``fail_on_regression`` percent (or cannot be told)."""
    paths_a, paths_b = resolve_side(spec_a, storage), resolve_side(spec_b, storage)
    effect = 5.0 if min_effect is None else min_effect
    table = compare([load_run(p) for p in paths_a], [load_run(p) for p in paths_b],
                    fail_on_regression, min_effect=effect / 100)
    for side, paths, spec in (("A", paths_a, spec_a), ("B", paths_b, spec_b)):
        print(f"{side} ({len(paths)} save{'s' if len(paths) > 1 else ''}): "
              + ", ".join(str(p) for p in paths))
        same_name = saves_named(paths[0], storage) if len(paths) == 1 else 1
        if same_name > 1:
            print(f"  ({spec!r} is the latest of {same_name} saves of that name; "
                  f"'{paths[0].stem.split('_', 1)[1]}*' compares them all)")
    print()
    print(compare_markdown(table))
    print()
    for line in compare_notes(table):
        print(line)
    written = write_compare(table, out)
    print()
    for path in written.values():
        print(f"wrote {path}")
    bad, unsure = regressions(table), unverified(table)
    if len(bad):
        worst = bad.iloc[0]
        print(f"{len(bad)} benchmark(s) slower beyond {fail_on_regression:g}%: "
              f"worst {worst['name']} median x{worst['median_ratio']:.3f}")
    if len(unsure):
        worst = unsure.iloc[0]
        print(f"{len(unsure)} benchmark(s) over the {fail_on_regression:g}% limit with one "
              f"save on a side, so noise cannot be ruled out: worst {worst['name']} median "
              f"x{worst['median_ratio']:.3f}")
    return 1 if len(bad) or len(unsure) else 0


def print_interleaved(a: Any, b: Any, rounds: int, filter_expr: str | None) -> int:
    """``simrig bench --interleave``: both sides (``releases.envs`` side specs, their
    ``python``) in alternating rounds, the B/A table with 95% intervals."""
    table = interleave(a.python, b.python, rounds, filter_expr=filter_expr,
                       log=lambda line: print(line, file=sys.stderr))
    print(f"A: {a.spec}\nB: {b.spec}  ({rounds} interleaved rounds)\n")
    shown = table.assign(**{
        "median A": table["median_a"].map(format_seconds),
        "median B": table["median_b"].map(format_seconds),
        "B/A": table["median_ratio"].map(lambda v: f"{v:.3f}"),
        "95% CI": [f"[{lo:.3f}, {hi:.3f}]" for lo, hi in zip(table["ci_low"], table["ci_high"])]})
    print(markdown_table(shown[["fullname", "median A", "median B", "B/A", "95% CI", "verdict"]]))
    return 0
