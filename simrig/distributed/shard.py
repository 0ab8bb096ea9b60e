"""One shard of a sharded fuzz campaign: its plan entry and what runs on its worker.

    plan_shards: shard i = (seed + i, mode, PCP slice i mod k), k = min(N, #PCP sizes)
    run_shard (a Ray task) ──► ShardCampaign = the existing Campaign with
                                 on_class  -> Collector.report_class (every new class,
                                              every smaller failing run, at once)
                                 stopped() -> Collector.beat every POLL_S: stats, counts;
                                              stop flag; classes shrunk elsewhere
                           ◄── ShardResult: stats, frames, class tally (the driver merges them)
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simrig import lifeline
from simrig.campaign.fuzz import Campaign, CampaignOptions, CampaignStats
from simrig.campaign.shrink import write_shrunk
from simrig.distributed.cluster import worker_name
from simrig.distributed.collector import actor_database
from simrig.findings.classes import ClassTally
from simrig.supervision.campaign_worker import persist_example
from simrig.vllm_runtime.interpreter_patches import memcheck_ran

POLL_S = 0.5  # heartbeat / stop-flag period of a shard


@dataclass(frozen=True)
class ShardSpec:
    index: int  # place in the plan
    seed: int
    mode: str
    pcp_sizes: tuple[int, ...]
    budget_s: float | None
    replay_regressions: bool
    attempt: int = 0  # replacements of a lost worker count up
    fruitless: int = 0  # workers of this shard in a row that died before finishing an example
    max_examples: int | None = None
    # where the shard persists its example before each step and its lifeline (a file): the
    # driver reads them when the worker is lost, for the crash class (simrig.supervision)
    crash_dir: str = ""

    @property
    def name(self) -> str:
        return f"s{self.index}" + (f".{self.attempt}" if self.attempt else "")


def plan_shards(options: CampaignOptions, workers: int) -> list[ShardSpec]:
    """seed x mode x PCP-size slice: N shards, PCP sizes dealt round-robin."""
    sizes = tuple(options.pcp_sizes)
    k = max(1, min(workers, len(sizes)))
    slices = [sizes[j::k] for j in range(k)]
    return [ShardSpec(index=i, seed=options.seed + i, mode=options.mode, pcp_sizes=slices[i % k],
                      budget_s=options.budget_s, max_examples=options.max_examples,
                      replay_regressions=options.replay_regressions and i == 0)
            for i in range(workers)]


# ------------------------------------------------------------------ worker side
class ShardCampaign(Campaign):
    """The existing Campaign, reporting to the Collector as it goes; its
    ``finish`` confirms the shrunk runs instead of writing a report."""

    def __init__(self, options: CampaignOptions, spec: ShardSpec, collector: Any):
        super().__init__(options)
        self.spec, self.collector = spec, collector
        self.worker = worker_name()
        self.started_at: float | None = None
        self._last_beat = 0.0
        self._shrunk_elsewhere: set[Any] = set()

    def beat(self, finished: bool = False) -> None:
        import ray  # optional: ray

        counts = {k: c.count for k, c in self.classes.items()}
        stats = dataclasses.asdict(self.stats)
        stats["rig_errors"] = len(self.stats.rig_errors)
        stats["elapsed_s"] = round(self._elapsed(), 3) if self._start else 0.0
        stop, shrunk = ray.get(self.collector.beat.remote(
            self.spec.name, self.worker, self.started_at, stats, counts, finished))
        if stop:
            self.interrupted = True
        self._shrunk_elsewhere.update(shrunk)

    def _before_step(self, machine: Any, index: int, step: Any) -> None:
        if self.spec.crash_dir:
            persist_example(Path(self.spec.crash_dir) / f"{self.spec.name}.inflight.pkl", self, machine, index)

    def between_chunks(self) -> None:
        # A class another shard already shrank needs no second shrink here.
        self.tolerated.update(self._shrunk_elsewhere)

    def stopped(self) -> bool:
        now = time.monotonic()
        if now - self._last_beat > POLL_S:
            self._last_beat = now
            self.beat()
        return super().stopped()

    def finish(self) -> None:
        with tempfile.TemporaryDirectory(prefix="simrig-shard-") as staging:
            for cls in sorted(self.classes.values(), key=lambda c: c.key):
                if cls.steps is not None and cls.source == "campaign":
                    try:
                        write_shrunk(cls, self.options, Path(staging))  # sets cls.reproduced
                    except Exception as exc:  # noqa: BLE001 -- reported as the driver would
                        self.rig_error(exc, "shrink")
                    self.options.on_class(cls)


@dataclass
class ShardResult:
    name: str
    worker: str
    stats: CampaignStats
    steps: Any  # recorder frames, rows labelled with the shard
    occurrences: Any
    contract: Any
    rig_errors: list[str]
    tally: ClassTally  # the shard's class table (first/last place, true occurrences)
    coverage: Any = None  # arcs of vLLM's MRV2 code the shard reached (options.coverage)
    memcheck: bool = False  # the worker's kernels ran under memcheck (its registry entry installed)
    vllm_version: str = ""  # the release the worker ran (the driver loads none)
    device: str = ""


def run_shard(spec: ShardSpec, base: CampaignOptions, collector: Any, database: Any) -> ShardResult:
    """A Ray task: one shard of the campaign on this worker."""
    from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

    load()  # the vLLM import is not part of the budget (as in a one-process campaign)
    options = dataclasses.replace(
        base, seed=spec.seed, mode=spec.mode, pcp_sizes=spec.pcp_sizes, budget_s=spec.budget_s,
        max_examples=spec.max_examples, replay_regressions=spec.replay_regressions,
        save_regressions=False, progress="quiet",
        database=actor_database(database, spec.name) if database is not None else None)
    campaign = ShardCampaign(options, spec, collector)
    options.on_class = lambda cls: collector.report_class.remote(spec.name, cls)
    campaign.started_at = time.time()
    campaign.beat()
    if spec.crash_dir:
        lifeline.install(lifeline.Lifeline(Path(spec.crash_dir) / f"{spec.name}.lifeline"))
    try:
        campaign.run()
    finally:
        lifeline.install(None)
        campaign.beat(finished=True)
    result = campaign.recorder.result([], list(spec.pcp_sizes), options.stages)
    for frame, column in ((result.steps, "trace"), (result.findings, "trace"),
                          (result.contract, "first_trace")):
        if column in frame.columns and len(frame):
            frame[column] = spec.name + "/" + frame[column].astype(str)
    return ShardResult(spec.name, campaign.worker, campaign.stats, result.steps, result.findings,
                       result.contract, campaign.stats.rig_errors, campaign.tally,
                       campaign.coverage.data() if campaign.coverage.enabled else None, memcheck_ran(),
                       campaign.vllm_version, campaign.device)
