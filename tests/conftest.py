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


@pytest.fixture
def ghost_trace(tmp_path):
    """A two-step trace whose second step schedules ``ghost-7``, an id never added:
    the runner must raise KeyError naming it."""
    from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
    from simrig.trace_io.trace import TraceHeader, write_trace

    path = tmp_path / "ghost.jsonl"
    steps = [Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4}),
             Step(cached=[CachedUpdate("a", 4)], num_scheduled_tokens={"a": 1, "ghost-7": 1})]
    write_trace(path, TraceHeader(config=RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16,
                                                      max_model_len=64)), steps)
    return path
