"""The vLLM packages the evidence tests read as text (never imported): the installed
release, the side venv ``SIMRIG_SIDE_VENV`` names, and every side venv at hand."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

RIG = Path(__file__).resolve().parents[1]


def installed_vllm() -> Path:
    """The installed ``vllm`` package folder."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vllm is not installed"
    return Path(list(spec.submodule_search_locations)[0])


def installed_and_named_side() -> list[Path]:
    """The installed release, then the one in the venv ``SIMRIG_SIDE_VENV`` names (CI sets it)."""
    roots = [installed_vllm()]
    side = os.environ.get("SIMRIG_SIDE_VENV", "")
    if side:
        found = sorted(Path(side).glob("lib/python*/site-packages/vllm"))
        assert found, f"SIMRIG_SIDE_VENV={side}: no vllm package in its site-packages"
        roots.append(found[0])
    return roots


def installed_and_finished_sides() -> list[Path]:
    """The installed release, then every side venv under .venvs/ that ``simrig env create``
    finished (its stamp): CI builds one while the suites run, and a half-installed vLLM is
    no release to read."""
    return [installed_vllm()] + sorted(
        p for p in RIG.glob(".venvs/vllm-*/lib/python*/site-packages/vllm")
        if p.is_dir() and (p.parents[3] / ".simrig-installed").is_file())
