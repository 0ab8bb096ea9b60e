"""What a fuzz campaign is given and what it keeps: options, finding classes, counters.

Plain data, shared by the one-process campaign (``simrig.campaign.fuzz``), its
report writer (``simrig.campaign.campaign_report``) and the sharded driver
(``simrig.distributed``), which ships these objects between Ray processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simrig.campaign.axes import AxisTally
from simrig.findings.classes import fails_run
from simrig.findings.findings import Finding
from simrig.observe import OPTIONAL_STAGES
from simrig.step import CUDAGRAPH_MODES, RunnerConfig, Step

Key = tuple[str, str, str, str, bool, str]  # signature + loud rejection + verdict


@dataclass
class CampaignOptions:
    budget_s: float | None = 60.0  # wall-clock seconds; None: none (max_examples bounds the run)
    seed: int = 0
    mode: str = "valid"
    pcp_sizes: tuple[int, ...] = (1, 2)
    # vLLM cudagraph modes to draw configs from (each step dispatched and padded
    # by vLLM's own CudaGraphManager); the default covers all five.
    cudagraph_modes: tuple[str, ...] = CUDAGRAPH_MODES
    out_dir: Path = Path("reports/fuzz")
    database: Any = Path(".cache/hypothesis")  # a folder, None, or a Hypothesis ExampleDatabase
    max_examples: int | None = None  # stop after this many examples (never cut by the clock
    # unless budget_s is also given)
    save_regressions: bool = False
    regressions_dir: Path = Path("traces/regressions")
    replay_regressions: bool = True
    stages: tuple[str, ...] = OPTIONAL_STAGES
    extra_checks: Sequence[Any] = ()  # fn(index, step, obs) -> list[Finding]
    violations: tuple[str, ...] | None = None  # adversarial violations (default: all)
    steps_per_example: int = 20  # Hypothesis stateful_step_count
    chunk_examples: int = 10  # examples per Hypothesis run
    shrink_grace_s: float | None = None  # extra time to finish a shrink (default budget/4, <= 120 s;
    # unbounded without a budget)
    progress: str | None = None  # tty / plain / quiet (default: tty when stderr is one)
    configs: Any = None  # strategy of RunnerConfig (default: small configs over pcp_sizes)
    # fn(FindingClass): a class was first seen or got a smaller failing run. Sharded
    # campaigns (simrig.distributed) stream each one to their driver as it happens.
    on_class: Any = None
    # line and branch coverage of vLLM's MRV2 folder (simrig.coverage); unexplained
    # never-reached lines fail the run (exit 1) only with fail_on_unexplained_coverage
    coverage: bool = False
    fail_on_unexplained_coverage: bool = False
    unreached: Path | None = None  # the reasons list (default: the shipped one, or SIMRIG_UNREACHED)
    # steering (needs coverage): hypothesis.target() on the MRV2 arcs an example reaches,
    # and examples that reached new arcs kept as traces in corpus_dir, replayed first next time
    steer: bool = False
    corpus_dir: Path | None = None
    # sample the stack (simrig.report.profile): OUT/profile/ holds the vLLM / Hypothesis / rig split
    profile: bool = False


@dataclass
class FindingClass:
    key: Key
    first: Finding
    count: int = 0
    source: str = "campaign"  # "campaign" or the regression trace it came from
    steps: list[Step] | None = None  # smallest failing run (campaign classes)
    violations: dict[int, str] = field(default_factory=dict)
    config: RunnerConfig | None = None
    trace_path: str = ""
    reproduced: bool | None = None
    example_steps: int = -1  # a crash class: its example's steps before it was shrunk (-1: not known)

    @property
    def loud(self) -> bool:
        return self.key[4]

    @property
    def verdict(self) -> str:
        return self.key[5]

    @property
    def failing(self) -> bool:
        return fails_run(self.verdict)

    def size(self) -> tuple[int, int, int]:
        steps = self.steps or []
        return (len(steps), sum(len(s.num_scheduled_tokens) for s in steps),
                sum(s.total_num_scheduled_tokens for s in steps))


@dataclass
class CampaignStats:
    examples: int = 0  # generated (or replayed from the database) up to a run's first failure
    shrink_runs: int = 0  # runs after it: Hypothesis shrinking that failure, its final replay
    steps: int = 0
    findings: int = 0  # finding occurrences (before dedupe)
    loud_rejections: int = 0
    violations_sent: int = 0
    chunks: int = 0
    regression_traces: int = 0
    regression_steps: int = 0
    elapsed_s: float = 0.0
    vllm_s: float = 0.0  # inside vLLM's calls, examples' steps only (StepObs.vllm_s summed)
    runners: dict[str, int] = field(default_factory=dict)  # built / reused / dropped (simrig.runners)
    stopped_by: str = "budget"
    rig_errors: list[str] = field(default_factory=list)
    crashes: int = 0  # workers that died or hung (simrig.supervision.campaign_worker)
    # steps per configured cudagraph mode, and per mode vLLM's dispatch chose
    steps_by_cudagraph_mode: dict[str, int] = field(default_factory=dict)
    steps_by_dispatched_mode: dict[str, int] = field(default_factory=dict)
    axes: AxisTally = field(default_factory=AxisTally)  # the request features drawn (axes.py)
