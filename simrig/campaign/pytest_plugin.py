"""pytest plugin (entry point ``pytest11``): drive the real runner from any test suite.

The pattern, as a vLLM developer writes it (default Hypothesis settings)::

    from hypothesis import given
    from strategies import scheduled_runs          # (config, [Step, ...]) valid under config

    @given(scheduled_runs())
    def test_runner_accepts_valid_schedules(simrig_run, run):
        simrig_run(run)

``simrig_run`` fails the test on a new finding class, the run written as a v1 trace;
every fixture is session-scoped and builds fresh objects per call.
See docs/pytest-plugin.md.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given  # noqa: F401  (re-exported for @given(scheduler_steps()))

from simrig.checks.checker import Checker
from simrig.coverage.collect import Collector
from simrig.coverage.session import coverage_line
from simrig.observe import OPTIONAL_STAGES
from simrig.step import NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceHeader, write_trace
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

RUN_STAGES = ("gather", "dummy")  # simrig_run's default: identity + dtype contract, fast
FAILURES_DIR = Path(".simrig") / "failures"  # under the rootdir; SIMRIG_FAILURES overrides


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simrig")
    group.addoption("--simrig-coverage", metavar="DIR", default=None,
                    help="collect line and branch coverage of the installed vLLM's MRV2 code "
                         "(vllm/v1/worker/gpu) over the whole session and write its tables, "
                         "summary.json and coverage.html to DIR")


_COVERAGE_KEY = pytest.StashKey[Any]()


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--simrig-coverage", default=None)
    if not out:
        return

    try:
        collector = Collector()
    except RuntimeError as exc:  # vLLM not installed
        raise pytest.UsageError(f"--simrig-coverage: {exc}") from None
    collector.start()
    config.stash[_COVERAGE_KEY] = (collector, out)


def pytest_unconfigure(config: pytest.Config) -> None:
    entry = config.stash.get(_COVERAGE_KEY, None)
    if entry is None:
        return
    collector, out = entry
    collector.stop()
    from simrig.report.writer import write_coverage_dir  # cold path: keeps pandas off every pytest start

    folder = write_coverage_dir(out, collector.data(), title="simrig coverage of a pytest session")

    summary = json.loads((Path(folder) / "summary.json").read_text())
    print(f"\n{coverage_line(summary)}\nsimrig coverage: {Path(folder) / 'coverage.html'}")


@pytest.fixture(scope="session")
def simrig_api() -> Any:
    """The installed vLLM, loaded once per session (~15 s on first use)."""
    from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

    return load()


@pytest.fixture(scope="session")
def simrig_harness(simrig_api: Any) -> Callable[..., Any]:
    """Factory: ``simrig_harness(config, stages=...)`` -> a fresh ready Harness."""
    from simrig.harness import Harness  # late-bound: tests monkeypatch harness.Harness

    def make(config: Any, stages: Iterable[str] = OPTIONAL_STAGES) -> Any:
        return Harness(config, stages=stages, api=simrig_api)

    return make


@pytest.fixture(scope="session")
def simrig_checker(simrig_api: Any) -> Callable[..., Any]:
    """Factory: ``simrig_checker(config, adversarial=False)`` -> a fresh Checker."""
    def make(config: Any, adversarial: bool = False, trace: str = "pytest") -> Any:
        return Checker(config, adversarial=adversarial, trace=trace)

    return make


@pytest.fixture(scope="session")
def simrig_run(simrig_api: Any, pytestconfig: pytest.Config) -> Callable[..., list]:
    """``simrig_run(run, stages=..., extra_checks=...)`` -> the run's findings; fails
    the test (readable summary + reproducer trace) on a new finding class."""
    root = Path(os.environ.get("SIMRIG_FAILURES") or pytestconfig.rootpath / FAILURES_DIR)
    _warm_up(simrig_api)

    def run_and_check(run: Any, *, stages: Sequence[str] = RUN_STAGES,
                      extra_checks: Sequence[Any] = ()) -> list:
        return check_run(run, api=simrig_api, stages=stages, extra_checks=extra_checks,
                         failures_dir=root)

    return run_and_check


def check_run(run: Any, *, api: Any = None, stages: Sequence[str] = RUN_STAGES,
              extra_checks: Sequence[Any] = (), failures_dir: Path = FAILURES_DIR,
              name: str | None = None, fail: bool = True) -> list:
    """Replay ``run`` = ``(config, steps)`` through the one replay loop; on a new finding
    class write the run as a v1 trace and ``pytest.fail`` with a class summary."""
    # cold path: keeps pandas off every pytest start
    from simrig.findings.classes import ClassTally, Where, class_rows_for_print, fails_run, verdict_of
    from simrig.replay import run_steps

    config, steps = _unpack(run)
    header = TraceHeader(config=config, source={"kind": "generated", "tool": "simrig pytest plugin"})
    found = []
    for replayed in run_steps(header, enumerate(steps), name="pytest", stages=stages,
                              extra_checks=extra_checks, api=api):
        found.extend(replayed.findings)
    new = [f for f in found if fails_run(verdict_of(f))]
    if not new or not fail:
        return found
    test = name or _current_test_name()
    path = Path(failures_dir) / f"{test}.jsonl"
    write_trace(path, header, steps)
    tally = ClassTally()
    for f in found:
        tally.add(f, Where("pytest", config.pcp_size))
    classes = tally.frame()
    classes = classes[classes["verdict"].astype(str).map(fails_run).astype(bool)]
    stage_arg = "" if tuple(stages) == _all_stages() else f" --stages {','.join(stages)}"
    lines = [f"simrig: {len(classes)} new finding class{'es' if len(classes) != 1 else ''} in a "
             f"{len(steps)}-step run ({_config_text(config)})",
             *class_rows_for_print(classes),
             f"reproducer (v1 trace; under Hypothesis the last failing, i.e. shrunk, example): {path}",
             f"  simrig replay {path}{stage_arg}"]
    pytest.fail("\n".join(lines), pytrace=False)
    return found  # not reached


def _warm_up(api: Any) -> None:
    """Pay the one-off first-call costs (imports, kernel set-up, caches: ~0.3-0.5 s
    on CPU) here, not in the first Hypothesis example, where they would break
    the default 200 ms deadline."""
    step = Step(new_requests=[NewRequest("warm", 4)], num_scheduled_tokens={"warm": 4})
    for config in (RunnerConfig(max_num_reqs=2, max_num_batched_tokens=16, max_model_len=64),
                   RunnerConfig(max_num_reqs=2, max_num_batched_tokens=16, max_model_len=64,
                                num_speculative_tokens=1, pcp_size=2)):
        check_run((config, [step]), api=api, fail=False)  # the test reports findings, not this


def _all_stages() -> tuple[str, ...]:
    return tuple(OPTIONAL_STAGES)


def _unpack(run: Any) -> tuple[Any, list]:
    if (not isinstance(run, tuple) or len(run) != 2 or not isinstance(run[0], RunnerConfig)):
        raise TypeError("simrig_run: expected (RunnerConfig, [Step, ...]) as drawn by "
                        f"scheduled_runs(), got {type(run).__name__}")
    return run[0], list(run[1])


def _config_text(config: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(config).items())


def _current_test_name() -> str:
    """The running test's node id as a file name (PYTEST_CURRENT_TEST is set by pytest)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "simrig-run").split(" ")[0]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", current.split("::", 1)[-1])[:120] or "simrig-run"
