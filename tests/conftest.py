"""Shared fixtures: one adapter for the installed vLLM per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm_api():
    """The real installed vLLM, loaded once (the import costs ~15 s on CPU)."""
    from simrig.adapters.runner import load

    return load()
