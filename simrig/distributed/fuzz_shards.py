"""``simrig fuzz --workers N``: one campaign as N shards on Ray, one merged report.

    plan_shards: shard i = (seed + i, mode, PCP slice i mod k), k = min(N, #PCP sizes)
                 shard 0 alone replays traces/regressions first
    driver ──run_shard.remote(spec)──► worker: ShardCampaign = the existing Campaign with
      │                                  on_class  -> Collector.report_class (every new class,
      │                                               every smaller failing run, at once)
      │                                  stopped() -> Collector.beat every POLL_S: stats,
      │                                               counts; stop flag; classes shrunk elsewhere
      │  ray.wait loop: progress lines; a lost worker -> its shard marked "lost",
      │                 the budget it had left reassigned to a replacement shard
      └─ Collector.snapshot ──► merged classes (shortest run each), per-shard rows,
                                report + junit.xml + shrunk/ (simrig.report.writer)

A worker that dies loses only what it had not yet reported: its classes (with
their smallest run so far) and its last heartbeat's counts stay in the report.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simrig.campaign.fuzz import Campaign, CampaignOptions, CampaignStats
from simrig.distributed.cluster import pinned_here, ray_session, worker_name
from simrig.distributed.collector import Collector, SharedDatabase, actor_database

POLL_S = 0.5  # heartbeat / stop-flag period of a shard
MIN_REASSIGN_S = 1.0  # a lost shard's leftover budget below this is not reassigned
STOP_GRACE_S = 60.0  # after a stop request, how long the driver waits for shards to return


@dataclass(frozen=True)
class ShardSpec:
    index: int  # place in the plan
    seed: int
    mode: str
    pcp_sizes: tuple[int, ...]
    budget_s: float
    replay_regressions: bool
    attempt: int = 0  # replacements of a lost worker count up

    @property
    def name(self) -> str:
        return f"s{self.index}" + (f".{self.attempt}" if self.attempt else "")


def plan_shards(options: CampaignOptions, workers: int) -> list[ShardSpec]:
    """seed x mode x PCP-size slice: N shards, PCP sizes dealt round-robin."""
    sizes = tuple(options.pcp_sizes)
    k = max(1, min(workers, len(sizes)))
    slices = [sizes[j::k] for j in range(k)]
    return [ShardSpec(index=i, seed=options.seed + i, mode=options.mode, pcp_sizes=slices[i % k],
                      budget_s=options.budget_s,
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
        import ray

        counts = {k: c.count for k, c in self.classes.items()}
        stats = dataclasses.asdict(self.stats)
        stats.pop("rig_errors")
        stats["rig_errors"] = len(self.stats.rig_errors)
        stats["elapsed_s"] = round(self._elapsed(), 3) if self._start else 0.0
        stop, shrunk = ray.get(self.collector.beat.remote(
            self.spec.name, self.worker, self.started_at, stats, counts, finished))
        if stop:
            self.interrupted = True
        self._shrunk_elsewhere.update(shrunk)

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
        from simrig.campaign.shrink import write_shrunk

        with tempfile.TemporaryDirectory(prefix="simrig-shard-") as staging:
            for cls in sorted(self.classes.values(), key=lambda c: c.key):
                if cls.steps is not None and not cls.trace_path:
                    write_shrunk(cls, self.options, Path(staging))  # sets cls.reproduced
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


def run_shard(spec: ShardSpec, base: CampaignOptions, collector: Any, database: Any) -> ShardResult:
    """A Ray task: one shard of the campaign on this worker."""
    from simrig.adapters.runner import load

    load()  # the vLLM import is not part of the budget (as in a one-process campaign)
    options = dataclasses.replace(
        base, seed=spec.seed, mode=spec.mode, pcp_sizes=spec.pcp_sizes, budget_s=spec.budget_s,
        replay_regressions=spec.replay_regressions, save_regressions=False, progress="quiet",
        database=actor_database(database, spec.name) if database is not None else None)
    campaign = ShardCampaign(options, spec, collector)
    options.on_class = lambda cls: collector.report_class.remote(spec.name, cls)
    campaign.started_at = time.time()
    campaign.beat()
    try:
        campaign.run()
    finally:
        campaign.beat(finished=True)
    result = campaign.recorder.result([], list(spec.pcp_sizes), options.stages)
    for frame in (result.steps, result.findings):
        if "trace" in frame.columns and len(frame):
            frame["trace"] = spec.name + "/" + frame["trace"].astype(str)
    return ShardResult(spec.name, campaign.worker, campaign.stats, result.steps, result.findings,
                       result.contract, campaign.stats.rig_errors)


# ------------------------------------------------------------------ driver side
@dataclass
class ShardRow:
    """One row of the report's shards table."""

    shard: str
    worker: str
    seed: int
    mode: str
    pcp_sizes: str
    status: str  # done / interrupted / lost / error
    examples: int = 0
    steps: int = 0
    elapsed_s: float = 0.0
    steps_per_s: float = 0.0
    examples_per_s: float = 0.0
    classes: int = 0
    note: str = ""


class ShardedCampaign:
    """Runs the plan on Ray and writes one report; ``run()`` returns the exit status."""

    def __init__(self, options: CampaignOptions, workers: int, address: str | None = None):
        self.options, self.workers, self.address = options, workers, address
        self.merged = Campaign(options)  # the one-process report code, fed merged data
        self.rows: list[ShardRow] = []
        self.results: dict[str, ShardResult] = {}
        self.notes: dict[str, str] = {}
        self.status: dict[str, str] = {}
        self.database_stats: dict[str, Any] = {}
        self.cluster: dict[str, Any] = {}
        self._stop_requested = False
        self._abandon = False

    def say(self, text: str) -> None:
        if self.options.progress != "quiet":
            print(f"fuzz: {text}", file=sys.stderr, flush=True)

    def run(self) -> int:
        started = time.perf_counter()
        cpu0 = _cpu_s()
        with ray_session(self.workers, self.address) as ray:
            self.cluster = {"address": self.address or os.environ.get("RAY_ADDRESS") or "local",
                            "cluster_cpus": ray.cluster_resources().get("CPU", 0),
                            "nodes": len([n for n in ray.nodes() if n.get("Alive")])}
            collector = ray.remote(num_cpus=0)(Collector).remote()
            database = None
            if self.options.database:
                database = ray.remote(**pinned_here(ray))(SharedDatabase).remote(
                    str(Path(self.options.database).resolve()))
            old = self._install_signal_handlers(ray, collector)
            try:
                self._drive(ray, collector, database)
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
                snapshot = ray.get(collector.snapshot.remote())
                if database is not None:
                    self.database_stats = ray.get(database.stats.remote())
        self._merge(snapshot)
        wall = time.perf_counter() - started
        self.write(wall, _cpu_s() - cpu0)
        return self.merged.exit_status()

    def _install_signal_handlers(self, ray: Any, collector: Any) -> dict[int, Any]:
        """First SIGINT/SIGTERM: every shard stops and reports; a second: stop waiting."""
        def handler(signum: int, frame: Any) -> None:
            if self._stop_requested:
                self._abandon = True
                return
            self._stop_requested = True
            collector.request_stop.remote()
            self.say("stopping every shard (again to stop waiting)")

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handler)
        return old

    def _drive(self, ray: Any, collector: Any, database: Any) -> None:
        from ray.exceptions import RayError, RayTaskError

        task = ray.remote(num_cpus=1, max_retries=0)(run_shard)
        base = dataclasses.replace(self.options, on_class=None, progress="quiet")
        pending = {}
        self.specs: dict[str, ShardSpec] = {}
        for spec in plan_shards(self.options, self.workers):
            pending[task.remote(spec, base, collector, database)] = spec
            self.specs[spec.name] = spec
        seen_events = 0
        stop_deadline = None
        while pending:
            if self._abandon or (stop_deadline is not None and time.monotonic() > stop_deadline):
                for ref, spec in pending.items():
                    self.status[spec.name] = "interrupted"
                    self.notes[spec.name] = "did not return after the stop request"
                    ray.cancel(ref, force=True)
                break
            if self._stop_requested and stop_deadline is None:
                stop_deadline = time.monotonic() + STOP_GRACE_S
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            events = ray.get(collector.events_since.remote(seen_events))
            seen_events += len(events)
            for line in events:
                self.say(line)
            for ref in ready:
                spec = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except RayTaskError as exc:  # the shard's own code raised: a rig bug
                    self.status[spec.name] = "error"
                    self.notes[spec.name] = str(exc).strip().splitlines()[-1][:300]
                    self.merged.stats.rig_errors.append(str(exc))
                    self.say(f"shard {spec.name} failed: {self.notes[spec.name]}")
                    continue
                except RayError as exc:  # worker process or node lost
                    replacement = self._lost(ray, collector, spec, exc)
                    if replacement is not None:
                        pending[task.remote(replacement, base, collector, database)] = replacement
                        self.specs[replacement.name] = replacement
                    continue
                self.results[spec.name] = result
                self.status[spec.name] = ("interrupted" if result.stats.stopped_by == "signal"
                                          else "done")
                self.say(f"shard {spec.name} done: {result.stats.examples} examples, "
                         f"{result.stats.steps} steps")

    def _lost(self, ray: Any, collector: Any, spec: ShardSpec, exc: Exception) -> ShardSpec | None:
        """Mark a lost shard; hand what was left of its budget to a replacement."""
        snapshot = ray.get(collector.snapshot.remote())
        state = snapshot["shards"].get(spec.name)
        used = (time.time() - state.started_at) if state and state.started_at else 0.0
        left = spec.budget_s - used
        reason = type(exc).__name__
        self.status[spec.name] = "lost"
        if self._stop_requested or left < MIN_REASSIGN_S:
            self.notes[spec.name] = f"worker lost ({reason}); nothing left to reassign"
            self.say(f"shard {spec.name} lost ({reason})")
            return None
        replacement = dataclasses.replace(spec, attempt=spec.attempt + 1, budget_s=round(left, 3),
                                          seed=spec.seed + 1_000 * (spec.attempt + 1))
        self.notes[spec.name] = (f"worker lost ({reason}); {left:.1f} s of budget reassigned "
                                 f"to {replacement.name}")
        self.say(f"shard {spec.name} lost ({reason}); {left:.1f} s reassigned to {replacement.name}")
        return replacement

    # -------------------------------------------------------------- merge and write
    def _merge(self, snapshot: dict[str, Any]) -> None:
        merged = self.merged
        shards = snapshot["shards"]
        merged.classes = {}
        for key, cls in snapshot["classes"].items():
            cls = dataclasses.replace(cls, count=sum(s.counts.get(key, 0) for s in shards.values()))
            merged.classes[key] = cls
        self.found_by = snapshot["found_by"]
        self.best_from = snapshot["best_from"]
        st = merged.stats
        for name, spec in self.specs.items():
            state = shards.get(name)
            result = self.results.get(name)
            if result is not None:
                stats = dataclasses.asdict(result.stats)
                stats["rig_errors"] = len(result.stats.rig_errors)
                st.rig_errors.extend(result.rig_errors)
            else:
                stats = dict(state.stats) if state else {}
            for fld in ("examples", "steps", "findings", "loud_rejections", "violations_sent",
                        "chunks", "regression_traces", "regression_steps"):
                setattr(st, fld, getattr(st, fld) + int(stats.get(fld, 0)))
            st.elapsed_s = max(st.elapsed_s, float(stats.get("elapsed_s", 0.0)))
            status = self.status.get(name, "lost")
            elapsed = float(stats.get("elapsed_s", 0.0)) or 1e-9
            self.rows.append(ShardRow(
                shard=name, worker=(result.worker if result else state.worker if state else ""),
                seed=spec.seed, mode=spec.mode, pcp_sizes=",".join(map(str, spec.pcp_sizes)),
                status=status, examples=int(stats.get("examples", 0)),
                steps=int(stats.get("steps", 0)), elapsed_s=round(elapsed, 3),
                steps_per_s=round(int(stats.get("steps", 0)) / elapsed, 3),
                examples_per_s=round(int(stats.get("examples", 0)) / elapsed, 3),
                classes=sum(1 for by in self.found_by.values() if name in by),
                note=self.notes.get(name, "")))
        statuses = [r.status for r in self.rows]
        st.stopped_by = ("signal" if snapshot["stopped"] or "interrupted" in statuses else "budget")

    def summary(self, wall_s: float, driver_cpu_s: float) -> dict[str, Any]:
        s = self.merged.summary()
        lost = [r.shard for r in self.rows if r.status == "lost"]
        s.update(workers=self.workers, shards=len(self.rows), lost_shards=lost,
                 reassigned={r.shard: r.note for r in self.rows if r.status == "lost"},
                 ray=self.cluster, wall_s=round(wall_s, 3),
                 driver_cpu_s=round(driver_cpu_s, 3),
                 driver_cpu_share=round(driver_cpu_s / max(wall_s, 1e-9), 4),
                 database=self.database_stats)
        return s

    def write(self, wall_s: float, driver_cpu_s: float) -> None:
        import shutil

        import pandas as pd

        from simrig.campaign.fuzz import junit_xml
        from simrig.campaign.shrink import shrunk_header, trace_name
        from simrig.replay import sort_rows
        from simrig.report.classes import classes_from_rows
        from simrig.report.writer import swap_into_place, write_report
        from simrig.sources.trace import write_trace

        o = self.options
        out = Path(o.out_dir)
        # The report, shrunk/ and junit.xml are built beside OUT and swapped in
        # whole: the report directory is complete or absent.
        report_staging = out.parent / f".{out.name}-staging"
        staging = out.parent / f".{out.name}-shrunk-staging"
        for folder in (report_staging, staging):
            shutil.rmtree(folder, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            for cls in sorted(self.merged.classes.values(), key=lambda c: c.key):
                if cls.steps is None or (cls.trace_path and cls.source != "campaign"):
                    continue
                path = staging / f"{trace_name(cls.key)}.jsonl"
                write_trace(path, shrunk_header(cls, o), cls.steps)
                cls.trace_path = str(out / "shrunk" / path.name)
                if o.save_regressions and cls.failing:
                    write_trace(Path(o.regressions_dir) / path.name, shrunk_header(cls, o), cls.steps)
            self.merged.stats.elapsed_s = round(self.merged.stats.elapsed_s, 3)
            summary = self.summary(wall_s, driver_cpu_s)
            findings = self.merged.findings_frame()
            if len(findings):
                keys = sorted(self.merged.classes)
                findings["found_by"] = [",".join(self.found_by.get(k, [])) for k in keys]
                findings["kept_from"] = [self.best_from.get(k, "") for k in keys]
            results = [self.results[n] for n in self.specs if n in self.results]
            steps = _concat([r.steps for r in results])
            occurrences = _concat([r.occurrences for r in results])
            contract = _merge_contract([r.contract for r in results])
            steps = sort_rows(steps, ("trace", "pcp_size", "step", "stage", "rank"))
            shards = pd.DataFrame([dataclasses.asdict(r) for r in self.rows])
            classes = classes_from_rows(findings)
            summary["exit_status"] = self.merged.exit_status()
            write_report(report_staging, steps, findings, contract, summary,
                         extra_tables={"occurrences": occurrences, "shards": shards},
                         title=f"simrig fuzz campaign on {self.workers} Ray workers",
                         classes=classes, occurrences=occurrences,
                         headline=self.merged.headline(summary))
            if any(staging.iterdir()):
                os.replace(staging, report_staging / "shrunk")
            (report_staging / "junit.xml").write_text(junit_xml(self.merged), encoding="utf-8")
            swap_into_place(report_staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(report_staging, ignore_errors=True)


def _concat(frames: list[Any]) -> Any:
    import pandas as pd

    frames = [f for f in frames if f is not None and len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _merge_contract(frames: list[Any]) -> Any:
    """Sum counts per (stage, field, kind, dtype); the first occurrence from the first shard."""
    from simrig.replay import sort_rows

    frame = _concat(frames)
    if not len(frame):
        return frame
    keys = ["stage", "field", "kind", "dtype"]
    counts = frame.groupby(keys, sort=False)["count"].sum()
    first = frame.drop_duplicates(keys).set_index(keys)
    first["count"] = counts
    return sort_rows(first.reset_index(), keys)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
