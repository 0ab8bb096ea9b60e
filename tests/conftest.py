"""Shared fixtures: one adapter for the installed vLLM per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm_api():
    """The real installed vLLM, loaded once (the import costs ~15 s on CPU)."""
    from simrig.adapters.runner import load

    return load()


@pytest.fixture(scope="session", autouse=True)
def _history_in_tmp(tmp_path_factory):
    """Commands run by tests record their history in a temporary store, never in reports/."""
    import os

    old = os.environ.get("SIMRIG_HISTORY")
    os.environ["SIMRIG_HISTORY"] = str(tmp_path_factory.mktemp("history"))
    yield
    if old is None:
        os.environ.pop("SIMRIG_HISTORY", None)
    else:
        os.environ["SIMRIG_HISTORY"] = old
