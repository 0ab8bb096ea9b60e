"""A vLLM git checkout, read with git itself: commits, ancestry, and per-commit overlays.

    resolve(repo, rev)                 a full commit hash (UsageError naming the flag)
    is_ancestor(repo, a, b)            git merge-base --is-ancestor
    commits_between(repo, old, new)    old .. new along the first-parent chain, oldest first
    touching(repo, commits, paths)     the commits that change the overlaid paths
    overlay_key(repo, commit, paths)   content key of those paths (tree/blob hashes): commits
                                       with the same MRV2 files share one overlay and one verdict
    materialize(repo, commit, paths, cache)  the paths' files at the commit, extracted once
                                       into cache/overlays/<key>/ (git archive)
    nearest_release(repo, commit)      the newest vX.Y.Z tag reachable from the commit
    changed_files / diff               between two commits, limited to the paths

Nothing here imports vLLM; the checkout is only read.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from simrig.errors import UsageError

_TAG = re.compile(r"^v?(\d+\.\d+\.\d+)$")


def git(repo: str | Path, *args: str, check: bool = True, binary: bool = False) -> str | bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=not binary, check=False)
    if check and proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise RuntimeError(f"git {' '.join(args[:2])}: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}")
    return proc.stdout


def check_repo(repo: str | Path, flag: str = "--repo") -> Path:
    path = Path(repo)
    if not path.is_dir():
        raise UsageError(f"{flag} {repo}: no such folder")
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise UsageError(f"{flag} {repo}: not a git repository")
    return path.resolve()


def resolve(repo: Path, rev: str, flag: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                           f"{rev}^{{commit}}"], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise UsageError(f"{flag} {rev}: not a commit of {repo}")
    return proc.stdout.strip()


def is_ancestor(repo: Path, a: str, b: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", a, b],
                          capture_output=True, check=False).returncode == 0


def commits_between(repo: Path, old: str, new: str) -> list[str]:
    """``old`` .. ``new`` inclusive, oldest first: the first-parent chain of ``new``
    back to ``old`` (a merge counts as one commit, as ``git bisect --first-parent``
    sees it); the full ancestry path when ``old`` is not on that chain."""
    out = str(git(repo, "rev-list", "--reverse", "--first-parent", "--ancestry-path",
                  f"{old}..{new}")).split()
    if out and str(git(repo, "rev-parse", f"{out[0]}^1", check=False)).strip() != old:
        out = str(git(repo, "rev-list", "--reverse", "--topo-order", "--ancestry-path",
                      f"{old}..{new}")).split()
    return [old, *out]


def touching(repo: Path, commits: list[str], paths: tuple[str, ...]) -> list[str]:
    """The commits (inner ones of ``commits``) whose overlaid files differ from their
    predecessor's in the list, with both ends kept."""
    if len(commits) <= 2:
        return list(commits)
    kept = [commits[0]]
    previous = overlay_key(repo, commits[0], paths)
    for commit in commits[1:-1]:
        key = overlay_key(repo, commit, paths)
        if key != previous:
            kept.append(commit)
        previous = key
    kept.append(commits[-1])
    return kept


def _object(repo: Path, commit: str, path: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                           f"{commit}:{path}"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else "absent"


def overlay_key(repo: Path, commit: str, paths: tuple[str, ...]) -> str:
    text = "\n".join(f"{p}:{_object(repo, commit, p)}" for p in paths)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def present_paths(repo: Path, commit: str, paths: tuple[str, ...]) -> list[str]:
    return [p for p in paths if _object(repo, commit, p) != "absent"]


def materialize(repo: Path, commit: str, paths: tuple[str, ...], cache: Path) -> tuple[Path, bool]:
    """(folder holding the paths' files at ``commit``, whether it was built now).
    Built once per content key into ``cache/overlays/<key>`` (atomic rename)."""
    key = overlay_key(repo, commit, paths)
    folder = cache / "overlays" / key
    if (folder / ".complete").is_file():
        return folder, False
    present = present_paths(repo, commit, paths)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=folder.parent))
    try:
        if present:
            data = git(repo, "archive", "--format=tar", commit, "--", *present, binary=True)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp, filter="data")
        (tmp / ".complete").write_text(f"{commit}\n{','.join(paths)}\n")
        try:
            os.replace(tmp, folder)
        except OSError:  # another run built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder, True


def nearest_release(repo: Path, commit: str) -> str | None:
    """'0.31.0' for a commit after tag v0.31.0 (None: no release tag reachable)."""
    proc = subprocess.run(["git", "-C", str(repo), "describe", "--tags", "--abbrev=0",
                           "--match", "v[0-9]*.[0-9]*.[0-9]*", commit], capture_output=True, text=True, check=False)
    match = _TAG.match(proc.stdout.strip()) if proc.returncode == 0 else None
    return match.group(1) if match else None


def short(commit: str) -> str:
    return commit[:10]


def subject(repo: Path, commit: str) -> str:
    return str(git(repo, "log", "-1", "--format=%s", commit)).strip()


def changed_files(repo: Path, a: str, b: str, paths: tuple[str, ...]) -> list[dict[str, str]]:
    out = str(git(repo, "diff", "--name-status", a, b, "--", *paths))
    rows = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2:
            rows.append({"status": parts[0], "path": parts[-1]})
    return rows


def diff(repo: Path, a: str, b: str, paths: tuple[str, ...]) -> str:
    return str(git(repo, "diff", a, b, "--", *paths))
