"""The points of a bisection, and how one is judged: a child replay in the right vLLM.

A point is a release (``release_points``: a side venv or the installed vLLM) or a
commit of a vLLM checkout laid over the closest installed release through
``simrig.vllm_runtime.overlay`` (``commit_points``, ``base_for``). ``Judge`` replays the
reproducer in a child process per point and reads its ``classes.csv`` (bad, good or
skip), caching each verdict.

See docs/bisect.md, 'From finding to fix' for the points, skips and the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simrig.bisect import gitrepo
from simrig.bisect.search import BAD, GOOD, SKIP, ClassKey, Verdict
from simrig.errors import UsageError
from simrig.findings.known import installed_vllm_version
from simrig.releases import envs

# Stages to replay for a class of each stage (lifecycle always runs; dummy
# parity needs the real batch).
STAGES_FOR = {"lifecycle": "gather", "gather": "gather", "dispatch": "gather",
              "prepare": "gather,prepare", "postprocess": "gather,prepare",
              "partition": "gather,prepare,partition", "dummy": "gather,prepare,dummy",
              "capture": "gather,prepare,dummy"}


@dataclass(frozen=True)
class Point:
    label: str  # '0.31.0' or a short commit hash
    ident: str  # the spec or the full commit hash
    kind: str  # release | commit
    python: str  # the interpreter that runs it
    base: str  # the vLLM release it runs on (a commit: the release under the overlay)
    subject: str = ""  # a commit's subject line


def vllm_version_of(python: str) -> str:
    proc = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def release_tuple(text: str) -> tuple[int, ...]:
    return envs._release_tuple(text)


def available_releases() -> dict[str, str]:
    """release -> interpreter: every side venv ``vllm-X.Y.Z`` under .venvs/, and the installed vLLM."""
    out: dict[str, str] = {}
    if envs.VENVS.is_dir():
        for venv in sorted(envs.VENVS.iterdir()):
            name = venv.name.removeprefix("vllm-")
            if venv.name.startswith("vllm-") and envs._RELEASE.match(name) \
                    and (venv / "bin" / "python").exists():
                out[name] = str(venv / "bin" / "python")

    installed = installed_vllm_version()
    if installed and installed not in out:
        out[installed] = sys.executable
    return out


def _release_point(spec: str, flag: str) -> Point:
    try:
        side = envs.side_for_compare(spec)
    except UsageError as exc:
        raise UsageError(f"{flag} {spec}: {str(exc).split(': ', 1)[-1]}") from None
    version = side.spec if side.kind == "release" else vllm_version_of(side.python)
    if not version:
        raise UsageError(f"{flag} {spec}: its interpreter cannot tell its vLLM version "
                         f"({side.python})")
    return Point(version, spec, "release", side.python, version)


def release_points(good: str, bad: str, good_flag: str, bad_flag: str) -> list[Point]:
    """Both ends and every release with a venv strictly between them, oldest first."""
    ends = [_release_point(good, good_flag), _release_point(bad, bad_flag)]
    lo, hi = sorted(ends, key=lambda p: release_tuple(p.base))
    if release_tuple(lo.base) == release_tuple(hi.base):
        raise UsageError(f"{good_flag} {good} and {bad_flag} {bad}: the same vLLM ({lo.base})")
    between = [Point(v, v, "release", py, v) for v, py in available_releases().items()
               if release_tuple(lo.base) < release_tuple(v) < release_tuple(hi.base)]
    return [lo, *sorted(between, key=lambda p: release_tuple(p.base)), hi]


def base_for(repo: Path, commit: str, base: str | None, releases: dict[str, str]) -> tuple[str, str]:
    """(release, interpreter) a commit runs on: ``--base``, else the newest release with a venv
    at or before the commit's nearest tag, else the oldest after it, else the installed vLLM."""
    if base:
        point = _release_point(base, "--base")
        return point.base, point.python
    tag = gitrepo.nearest_release(repo, commit)
    if tag and releases:
        before = [v for v in releases if release_tuple(v) <= release_tuple(tag)]
        after = [v for v in releases if release_tuple(v) > release_tuple(tag)]
        chosen = max(before, key=release_tuple) if before else min(after, key=release_tuple)
        return chosen, releases[chosen]

    return installed_vllm_version() or "installed", sys.executable


def commit_points(repo: Path, old: str, new: str, paths: tuple[str, ...], base: str | None
                  ) -> tuple[list[Point], int]:
    """(the commits from ``old`` to ``new`` that change the overlaid paths, both ends
    kept, oldest first; how many commits the range holds in all)."""
    commits = gitrepo.commits_between(repo, old, new)
    kept = gitrepo.touching(repo, commits, paths)
    releases = available_releases() if base is None else {}
    points = []
    for commit in kept:
        version, python = base_for(repo, commit, base, releases)
        points.append(Point(gitrepo.short(commit), commit, "commit", python, version,
                            gitrepo.subject(repo, commit)))
    return points, len(commits)


class Judge:
    """Judges points by child replays (docs/bisect.md)."""

    def __init__(self, trace: Path, key: ClassKey, *, stages: str | None, cache: Path,
                 use_cache: bool = True, repo: Path | None = None,
                 paths: tuple[str, ...] = ("vllm/v1/worker/gpu",), timeout: float = 900,
                 log: Any = None):
        self.trace = trace.resolve()
        self.key = key
        self.stages = stages or STAGES_FOR.get(key.stage, "gather,prepare,partition,dummy")
        self.cache = cache
        self.use_cache = use_cache
        self.repo = repo
        self.paths = paths
        self.timeout = timeout
        self.log = log or (lambda line: None)
        self.trace_hash = hashlib.sha1(self.trace.read_bytes()).hexdigest()
        self.results: dict[str, Verdict] = {}

    def judged_with(self) -> list[str]:
        """A point's verdict is one class, so its replay measures no coverage and runs the
        kernel checker (up to 1.25x a replay) only where the class may be the checker's
        (a Kernel*Error, or an exception class that names no type)."""
        key = self.key
        checked = key.exception_type.startswith("Kernel") or (key.kind == "exception" and not key.exception_type)
        return ["--no-coverage"] + ([] if checked else ["--no-memcheck"])

    def _cache_file(self, point: Point, overlay: str) -> Path:
        stamp = Path(point.python).parents[1] / ".simrig-installed"
        text = json.dumps([point.python, stamp.stat().st_mtime if stamp.exists() else 0, overlay,
                           self.trace_hash, self.key.text, self.stages, list(self.paths),
                           self.judged_with()])
        return self.cache / "verdicts" / (hashlib.sha1(text.encode()).hexdigest()[:20] + ".json")

    def __call__(self, point: Point) -> Verdict:
        if point.ident in self.results:
            return self.results[point.ident]
        overlay = ""
        if point.kind == "commit":
            overlay = gitrepo.overlay_key(self.repo, point.ident, self.paths)
        cache_file = self._cache_file(point, overlay)
        if self.use_cache and cache_file.is_file():
            data = json.loads(cache_file.read_text())
            result = Verdict(data["verdict"], data["reason"], data["seconds"], True, data["detail"])
        else:
            result = self._run(point)
            if not result.detail.get("transient"):
                cache_file.parent.mkdir(parents=True, exist_ok=True)
                cache_file.write_text(json.dumps({"verdict": result.verdict, "reason": result.reason,
                                                  "seconds": result.seconds, "detail": result.detail}))
        self.results[point.ident] = result
        self.log(f"bisect: {point.label} {result.verdict}{' (cached)' if result.cached else ''}"
                 f" in {result.seconds:.1f} s{': ' + result.reason if result.reason else ''}")
        return result

    def _run(self, point: Point) -> Verdict:
        env = {**os.environ, "SIMRIG_HISTORY": "none"}
        for name in ("SIMRIG_OVERLAY", "SIMRIG_OVERLAY_PATHS", "SIMRIG_OVERLAY_LOG"):
            env.pop(name, None)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="simrig-bisect-") as work:
            work_dir = Path(work)
            served_log = work_dir / "overlay.log"
            if point.kind == "commit":
                folder, _ = gitrepo.materialize(self.repo, point.ident, self.paths, self.cache)
                env.update(SIMRIG_OVERLAY=str(folder), SIMRIG_OVERLAY_PATHS=",".join(self.paths),
                           SIMRIG_OVERLAY_LOG=str(served_log))
            out = work_dir / "report"
            cmd = [point.python, "-m", "simrig.vllm_runtime.overlay", "replay", str(self.trace), "--json",
                   "--quiet", "--out", str(out), "--stages", self.stages, *self.judged_with()]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=envs.PROJECT,
                                      timeout=self.timeout, check=False)
            except subprocess.TimeoutExpired:
                return Verdict(SKIP, f"timed out after {self.timeout:.0f} s",
                               time.perf_counter() - started, detail={"transient": True})
            seconds = time.perf_counter() - started
            served = served_log.read_text().splitlines() if served_log.is_file() else []
            return judge_report(out, proc.returncode, proc.stderr, self.key, seconds,
                                commit=point.kind == "commit", served=len(served))


def judge_report(out: Path, status: int, stderr: str, key: ClassKey, seconds: float, *,
                 commit: bool = False, served: int = 0) -> Verdict:
    """The verdict one child replay's report (or its absence) gives."""
    import pandas as pd  # lazy: pandas loads only when a report is read

    detail: dict[str, Any] = {"exit_status": status, "served_modules": served}
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if not (out / "classes.csv").is_file():
        why = lines[-1] if lines else f"the replay exited {status} without a report"
        return Verdict(SKIP, why[:300], seconds, detail=detail)
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False).to_dict("records")
    summary = json.loads((out / "summary.json").read_text())
    detail.update(vllm_version=summary.get("vllm_version", ""), classes=len(classes))
    if commit and served == 0:
        return Verdict(SKIP, "no module was served from the commit (overlay not used)", seconds,
                       detail=detail)
    if any(key.matches(row) for row in classes):
        shown = [r for r in classes if key.matches(r)]
        detail["occurrences"] = int(sum(int(r.get("occurrences", 0) or 0) for r in shown))
        detail["message"] = str(shown[0].get("message", ""))[:300]
        return Verdict(BAD, "", seconds, detail=detail)
    off = [u for u in summary.get("unavailable") or [] if u.get("stage") == key.stage]
    if off:
        return Verdict(SKIP, f"stage {key.stage} unavailable: {off[0].get('reason', '')}"[:300], seconds,
                       detail=detail)
    rig = [r for r in classes if r.get("kind") == "rig_error"]
    if rig or status == 3:
        why = str(rig[0].get("message", "")) if rig else "simrig's own code raised"
        return Verdict(SKIP, f"rig error: {why}"[:300], seconds, detail=detail)
    return Verdict(GOOD, "", seconds, detail=detail)
