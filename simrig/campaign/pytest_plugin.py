"""pytest plugin (entry point ``pytest11``): fixtures for suites that drive the real runner.

    def test_runner_accepts(simrig_harness, simrig_checker):
        config = RunnerConfig(max_num_reqs=4)
        harness, checker = simrig_harness(config), simrig_checker(config)
        ...

    from simrig.campaign.pytest_plugin import given, scheduled_runs     # strategies, re-exported
    @given(scheduled_runs())
    def test_any_valid_schedule(simrig_harness, run): ...

vLLM is imported lazily, on the first fixture use, so suites that never ask
for a fixture pay nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from hypothesis import given  # noqa: F401  (re-exported for @given(scheduler_steps()))

from strategies import (  # noqa: F401  (re-exported)
    MachineSettings,
    SchedulerContractMachine,
    cudagraph_descriptors,
    new_requests,
    runner_configs,
    scheduled_runs,
    scheduler_step,
    scheduler_steps,
)


@pytest.fixture(scope="session")
def simrig_api() -> Any:
    """The installed vLLM, loaded once per session (~15 s on first use)."""
    from simrig.adapters.runner import load

    return load()


@pytest.fixture
def simrig_harness(simrig_api: Any) -> Callable[..., Any]:
    """Factory: ``simrig_harness(config, stages=...)`` -> a fresh ready Harness."""
    from simrig.harness import Harness
    from simrig.observe import OPTIONAL_STAGES

    def make(config: Any, stages: Iterable[str] = OPTIONAL_STAGES) -> Any:
        return Harness(config, stages=stages, api=simrig_api)

    return make


@pytest.fixture
def simrig_checker() -> Callable[..., Any]:
    """Factory: ``simrig_checker(config, adversarial=False)`` -> a fresh Checker."""
    from simrig.checks.checker import Checker

    def make(config: Any, adversarial: bool = False, trace: str = "pytest") -> Any:
        return Checker(config, adversarial=adversarial, trace=trace)

    return make
