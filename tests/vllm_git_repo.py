"""A small vLLM git repository built at test time from the INSTALLED vLLM's MRV2 files.

Nothing of vLLM is committed to simrig: the files are read from the installed
package (``importlib.util.find_spec``, without importing vLLM) into ``tmp_path``
and committed there, with a history that a bisection must see through:

    c0  base              vllm/v1/worker/gpu as installed                      good
    c1  docs              README only (no MRV2 change)                         good
    c2  comment           a comment in gpu/states.py (an unrelated MRV2 edit)  good
    c3  broken import     gpu/model_runner.py imports a module that is absent  cannot import: skip
    c4  fix import        removes it again                                     good
    c5  regression        prepare_inputs copies idx_mapping as torch.int32      bad  (introduced)
    c6  docs              README only                                          bad
    c7  comment           a comment in gpu/input_batch.py                      bad
    c8  revert            restores torch.int64                                 good (fixed)
    c9  docs              README only                                          good

The regression is the edit of the selftest mutant ``idx-mapping-device-int32``
(simrig/selftest/catalogue.py), applied to the file text.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

MRV2 = "vllm/v1/worker/gpu"
REGRESSION_OLD = "idx_mapping_np, device=self.device, dtype=torch.int64"
REGRESSION_NEW = "idx_mapping_np, device=self.device, dtype=torch.int32"
BROKEN_IMPORT = "import vllm.v1.worker.gpu.simrig_no_such_helper  # noqa: F401\n"


def installed_mrv2() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "vLLM is not installed"
    return Path(spec.origin).parent / "v1" / "worker" / "gpu"


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "PATH": "/usr/bin:/bin:/usr/local/bin",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name}: the edit no longer applies to the installed vLLM"
    path.write_text(text.replace(old, new))


def build(root: Path) -> dict[str, str]:
    """Create the repository under ``root``; returns {name: commit hash} (c0 … c9)."""
    root.mkdir(parents=True, exist_ok=True)
    _git(root, "init", "-q", "-b", "main")
    gpu = root / MRV2
    shutil.copytree(installed_mrv2(), gpu, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    readme = root / "README.md"
    readme.write_text("test checkout\n")
    commits = {"c0": _commit(root, "base: MRV2 as installed")}
    readme.write_text("test checkout\n\nmore docs\n")
    commits["c1"] = _commit(root, "docs: more words")
    states = gpu / "states.py"
    states.write_text(states.read_text() + "\n# an unrelated comment\n")
    commits["c2"] = _commit(root, "states: a comment")
    runner = gpu / "model_runner.py"
    clean = runner.read_text()
    runner.write_text(BROKEN_IMPORT + clean)
    commits["c3"] = _commit(root, "model_runner: import a helper that does not exist")
    runner.write_text(clean)
    commits["c4"] = _commit(root, "model_runner: drop the broken import")
    _edit(runner, REGRESSION_OLD, REGRESSION_NEW)
    commits["c5"] = _commit(root, "model_runner: copy idx_mapping as int32")
    readme.write_text(readme.read_text() + "even more docs\n")
    commits["c6"] = _commit(root, "docs: even more")
    batch = gpu / "input_batch.py"
    batch.write_text(batch.read_text() + "\n# another unrelated comment\n")
    commits["c7"] = _commit(root, "input_batch: a comment")
    _edit(runner, REGRESSION_NEW, REGRESSION_OLD)
    commits["c8"] = _commit(root, "Revert: copy idx_mapping as int64 again")
    readme.write_text(readme.read_text() + "last docs\n")
    commits["c9"] = _commit(root, "docs: last")
    return commits
