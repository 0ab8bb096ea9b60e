"""``simrig fuzz --workers N``: one campaign as N shards on Ray, one merged report.

``ShardedCampaign`` plans the shards (seed, mode, PCP slice), waits on them, reassigns
a lost worker's budget, and merges what every shard reported (``MergedCampaign``) for
the one-process report writer (``simrig.campaign.campaign_report``). A worker that dies loses
only what it had not yet reported.

See docs/ray.md, 'Fuzz shards'.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.campaign.campaign_report import ReportTables, write_campaign_report
from simrig.campaign.fuzz import Campaign, CampaignOptions
from simrig.distributed.cluster import pinned_here, ray_session, worker_options
from simrig.distributed.collector import Collector, SharedDatabase
from simrig.distributed.merge import concat_frames, merge_contract, prefixed, tally_from_counts
from simrig.distributed.shard import POLL_S, ShardResult, ShardSpec, plan_shards, run_shard  # noqa: F401 -- plan_shards re-exported
from simrig.findings.classes import merge_tallies
from simrig.interrupt import StopRequests
from simrig.lifeline import Lifeline
from simrig.replay import sort_rows
from simrig.supervision import forked
from simrig.supervision.campaign_worker import apply_crash, crash_record

# Ray's answers for a worker process that died under its task (a signal, an OOM kill): a crash
# class when the driver can read what the shard persisted; a lost node or raylet is only lost
WORKER_DEATHS = ("WorkerCrashedError", "OutOfMemoryError")
MIN_REASSIGN_S = 1.0  # a lost shard's leftover budget below this is not reassigned
# A shard whose workers die this many times in a row before finishing one example is given
# up: each replacement costs a fresh process and a vLLM import (tens of seconds on a
# CPU), and a fault that kills every example would spend the whole budget on them. Its
# crash classes are kept; the other shards go on.
MAX_FRUITLESS_CRASHES = 2
STOP_GRACE_S = 60.0  # after a stop request, how long the driver waits for shards to return


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
    shrink_runs: int = 0
    steps: int = 0
    elapsed_s: float = 0.0
    vllm_s: float = 0.0  # inside vLLM's calls (StepObs.vllm_s summed)
    steps_per_s: float = 0.0
    examples_per_s: float = 0.0
    classes: int = 0
    note: str = ""


class MergedCampaign(Campaign):
    """The one-process campaign's report code, fed the shards' merged data:
    the same tables, summary keys and exit status, plus the shards."""

    def __init__(self, options: CampaignOptions, sharded: ShardedCampaign):
        super().__init__(options)
        self.sharded = sharded
        self.wall_s = self.driver_cpu_s = 0.0

    def not_repeatable(self) -> list[str]:
        reasons = super().not_repeatable()
        if len(self.sharded.rows) > 1:
            reasons.append(f"{len(self.sharded.rows)} shards skip classes another shard "
                           "already shrank, as they report them")
        return reasons

    def summary(self) -> dict[str, Any]:
        # the release and device the shards ran, as a one-process campaign states its own (a
        # run is compared with the previous run of its suite on the same release)
        results = self.sharded.results.values()
        self.vllm_version = ",".join(sorted({r.vllm_version for r in results if r.vllm_version}))
        self.device = ",".join(sorted({r.device for r in results if r.device}))
        s, rows = super().summary(), self.sharded.rows
        s.update(workers=self.sharded.workers, shards=len(rows),
                 lost_shards=[r.shard for r in rows if r.status == "lost"],
                 reassigned={r.shard: r.note for r in rows if r.status == "lost"},
                 ray=self.sharded.cluster, wall_s=round(self.wall_s, 3),
                 driver_cpu_s=round(self.driver_cpu_s, 3),
                 driver_cpu_share=round(self.driver_cpu_s / max(self.wall_s, 1e-9), 4),
                 database=self.sharded.database_stats,
                 # as the shards' kernels ran: the driver runs none
                 memcheck=bool(self.sharded.results)
                 and all(r.memcheck for r in self.sharded.results.values()))
        return s

    def findings_frame(self) -> Any:
        findings = super().findings_frame()
        if len(findings):
            keys = sorted(self.classes)
            findings["found_by"] = [",".join(self.sharded.found_by.get(k, [])) for k in keys]
            findings["kept_from"] = [self.sharded.best_from.get(k, "") for k in keys]
        return findings

    def report_tables(self) -> Any:
        results = [self.sharded.results[n] for n in self.sharded.specs if n in self.sharded.results]
        steps = sort_rows(concat_frames([r.steps for r in results]),
                          ("trace", "pcp_size", "step", "stage", "rank"))
        shards = pd.DataFrame([dataclasses.asdict(r) for r in self.sharded.rows])
        return ReportTables(steps, concat_frames([r.occurrences for r in results]),
                            merge_contract([r.contract for r in results]),
                            busy_s=sum(r.elapsed_s for r in self.sharded.rows),
                            vllm_s=sum(r.vllm_s for r in self.sharded.rows),
                            title=f"simrig fuzz campaign on {self.sharded.workers} Ray workers",
                            extra={"shards": shards})


class ShardedCampaign:
    """Runs the plan on Ray and writes one report; ``run()`` returns the exit status."""

    def __init__(self, options: CampaignOptions, workers: int, address: str | None = None):
        self.options, self.workers, self.address = options, workers, address
        self.merged = MergedCampaign(options, self)
        self.rows: list[ShardRow] = []
        self.results: dict[str, ShardResult] = {}
        self.specs: dict[str, ShardSpec] = {}
        self.notes: dict[str, str] = {}
        self.status: dict[str, str] = {}
        self.database_stats: dict[str, Any] = {}
        self.cluster: dict[str, Any] = {}
        self.found_by: dict[Any, list[str]] = {}
        self.best_from: dict[Any, str] = {}
        self.errors: list[tuple[BaseException, str]] = []  # raised by a shard task or the driver
        self.crashes: list[dict[str, Any]] = []  # lost workers' last examples (crash classes)
        self.crash_dir = ""
        self._stop: Any = None

    def say(self, text: str) -> None:
        if self.options.progress != "quiet":
            print(f"fuzz: {text}", file=sys.stderr, flush=True)

    def run(self) -> int:
        started, cpu0 = time.perf_counter(), _cpu_s()
        out = Path(self.options.out_dir).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        self.crash_dir = tempfile.mkdtemp(prefix=f".{out.name}-shards-", dir=out.parent)
        try:
            return self._run(started, cpu0)
        finally:
            shutil.rmtree(self.crash_dir, ignore_errors=True)

    def _run(self, started: float, cpu0: float) -> int:
        with StopRequests(second_raises=False,
                          note="stopping every shard (again to stop waiting for them)") as stop:
            self._stop = stop
            with ray_session(self.workers, self.address) as ray:
                self.cluster = {"address": self.address or os.environ.get("RAY_ADDRESS") or "local",
                                "cluster_cpus": ray.cluster_resources().get("CPU", 0),
                                "nodes": len([n for n in ray.nodes() if n.get("Alive")])}
                collector = ray.remote(num_cpus=0)(Collector).remote()
                database = None
                if self.options.database:
                    database = ray.remote(**pinned_here(ray))(SharedDatabase).remote(
                        str(Path(self.options.database).resolve()))
                try:
                    self._drive(ray, collector, database)
                except Exception as exc:  # noqa: BLE001 -- the driver's own bug: reported
                    self.errors.append((exc, "driver"))
                with stop.shield():  # from here on the report is being written
                    snapshot = ray.get(collector.snapshot.remote())
                    if database is not None:
                        self.database_stats = ray.get(database.stats.remote())
                    self._merge(snapshot)
                    self.merged.wall_s = time.perf_counter() - started
                    self.merged.driver_cpu_s = _cpu_s() - cpu0
                    write_campaign_report(self.merged, confirm=False)  # shards confirmed theirs
        return self.merged.exit_status()

    def _drive(self, ray: Any, collector: Any, database: Any) -> None:
        from ray.exceptions import RayError, RayTaskError  # optional: ray

        task = ray.remote(num_cpus=1, max_retries=0, **worker_options())(run_shard)
        base = dataclasses.replace(self.options, on_class=None, progress="quiet")
        pending = {}
        for spec in plan_shards(self.options, self.workers):
            spec = dataclasses.replace(spec, crash_dir=self.crash_dir)
            pending[task.remote(spec, base, collector, database)] = spec
            self.specs[spec.name] = spec
        seen_events = 0
        stop_deadline = None
        while pending:
            if self._stop.abandon or (stop_deadline is not None and time.monotonic() > stop_deadline):
                for ref, spec in pending.items():
                    self.status[spec.name] = "interrupted"
                    self.notes[spec.name] = "did not return after the stop request"
                    ray.cancel(ref, force=True)
                break
            if self._stop.requested and stop_deadline is None:
                collector.request_stop.remote()
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
                    self.errors.append((exc, "shard"))
                    self.say(f"shard {spec.name} failed: {self.notes[spec.name]}")
                    continue
                except RayError as exc:  # worker process or node lost
                    replacement = self._lost(ray, collector, spec, exc)
                    if replacement is not None:
                        pending[task.remote(replacement, base, collector, database)] = replacement
                        self.specs[replacement.name] = replacement
                    continue
                self.results[spec.name] = result
                self.status[spec.name] = {"signal": "interrupted", "rig_error": "error"}.get(
                    result.stats.stopped_by, "done")
                self.say(f"shard {spec.name} done: {result.stats.examples} examples "
                         f"(+{result.stats.shrink_runs} shrink runs), "
                         f"{result.stats.steps} steps")

    def _lost(self, ray: Any, collector: Any, spec: ShardSpec, exc: Exception) -> ShardSpec | None:
        """Mark a lost shard; hand what was left of its budget (or examples) to a replacement."""
        state = ray.get(collector.snapshot.remote())["shards"].get(spec.name)
        used = (time.time() - state.started_at) if state and state.started_at else 0.0
        done = int(state.stats.get("examples", 0)) if state else 0
        left = None if spec.budget_s is None else spec.budget_s - used
        examples = None if spec.max_examples is None else spec.max_examples - done
        reason = type(exc).__name__
        self.status[spec.name] = "lost"
        fruitless = 0
        if reason in WORKER_DEATHS:  # the process died under the shard (a lost node is not a crash)
            self._crashed(spec, reason)
            fruitless = spec.fruitless + 1 if done == 0 else 0
        if fruitless >= MAX_FRUITLESS_CRASHES:
            self.notes[spec.name] = (f"worker lost ({reason}); {fruitless} workers in a row died "
                                     "before finishing an example: shard given up")
            self.say(f"shard {spec.name} lost ({reason}); given up after {fruitless} workers in a row "
                     "died before finishing an example")
            return None
        if self._stop.requested or (left is not None and left < MIN_REASSIGN_S) \
                or (examples is not None and examples < 1):
            self.notes[spec.name] = f"worker lost ({reason}); nothing left to reassign"
            self.say(f"shard {spec.name} lost ({reason})")
            return None
        replacement = dataclasses.replace(
            spec, attempt=spec.attempt + 1, budget_s=None if left is None else round(left, 3),
            max_examples=examples, seed=spec.seed + 1_000 * (spec.attempt + 1), fruitless=fruitless)
        what = f"{left:.1f} s" if left is not None else f"{examples} examples"
        self.notes[spec.name] = f"worker lost ({reason}); {what} reassigned to {replacement.name}"
        self.say(f"shard {spec.name} lost ({reason}); {what} reassigned to {replacement.name}")
        return replacement

    def _crashed(self, spec: ShardSpec, reason: str) -> None:
        """A lost worker's last example, as it persisted it before the step it died in: a
        crash class (when the driver can read the shard's files: the same machine)."""
        base = Path(self.crash_dir) / spec.name
        inflight = forked.load(base.with_name(base.name + ".inflight.pkl"))
        line = base.with_name(base.name + ".lifeline")
        if inflight is None or not line.is_file():
            return
        self.crashes.append(crash_record(inflight, Lifeline(line, fresh=False).read(), reason))

    # -------------------------------------------------------------- merge
    def _merge(self, snapshot: dict[str, Any]) -> None:
        """Classes with the shards' summed counts, one class tally, totals and rows."""
        merged, shards = self.merged, snapshot["shards"]
        merged.classes = {key: dataclasses.replace(cls, count=sum(s.counts.get(key, 0)
                                                                  for s in shards.values()))
                          for key, cls in snapshot["classes"].items()}
        self.found_by, self.best_from = snapshot["found_by"], snapshot["best_from"]
        st, tallies, stopped_by = merged.stats, [], set()
        for name, spec in self.specs.items():
            state, result = shards.get(name), self.results.get(name)
            if result is not None:
                merged.coverage.add(getattr(result, "coverage", None))  # union of the shards' arcs
                stats = dict(dataclasses.asdict(result.stats), rig_errors=len(result.rig_errors))
                st.rig_errors.extend(result.rig_errors)
                tallies.append((result.tally, prefixed(name)))
                stopped_by.add(result.stats.stopped_by)
                st.axes.merge(result.stats.axes)
            else:  # lost or failed: what its last heartbeat counted
                stats = dict(state.stats) if state else {}
                tallies.append((tally_from_counts(name, state, merged.classes), None))
            for fld in ("examples", "shrink_runs", "steps", "findings", "loud_rejections", "violations_sent",
                        "chunks", "regression_traces", "regression_steps"):
                setattr(st, fld, getattr(st, fld) + int(stats.get(fld, 0)))
            for fld, n in (stats.get("runners") or {}).items():  # each shard's own runners
                st.runners[fld] = st.runners.get(fld, 0) + int(n)
            elapsed = float(stats.get("elapsed_s", 0.0))
            st.elapsed_s = max(st.elapsed_s, round(elapsed, 3))
            examples, steps = int(stats.get("examples", 0)), int(stats.get("steps", 0))
            self.rows.append(ShardRow(
                shard=name, worker=(result.worker if result else state.worker if state else ""),
                seed=spec.seed, mode=spec.mode, pcp_sizes=",".join(map(str, spec.pcp_sizes)),
                status=self.status.get(name, "lost"), examples=examples,
                shrink_runs=int(stats.get("shrink_runs", 0)), steps=steps,
                elapsed_s=round(elapsed, 3), vllm_s=round(float(stats.get("vllm_s", 0.0)), 3),
                steps_per_s=round(steps / max(elapsed, 1e-9), 3),
                examples_per_s=round(examples / max(elapsed, 1e-9), 3),
                classes=sum(1 for by in self.found_by.values() if name in by),
                note=self.notes.get(name, "")))
        merged.tally = merge_tallies(tallies)
        for crash in self.crashes:
            apply_crash(merged, crash)
        for exc, where in self.errors:
            merged.rig_error(exc, where)
        statuses = {r.status for r in self.rows}
        st.stopped_by = ("signal" if snapshot["stopped"] or "interrupted" in statuses else
                         "rig_error" if "error" in statuses else
                         "max_examples" if stopped_by == {"max_examples"} else "budget")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
