"""Record traces from vLLM's real scheduler, fed by a workload (vLLM-agnostic).

``record`` runs one loop on a simulated clock: admit the requests that have arrived, the real
``schedule()``, a synthetic sampler, the real ``update_from_output``, one Step to the trace,
then the clock advances by a modelled step time (``StepTimeModel``). The loop is drawn in
``record``'s docstring; the scheduler-side plumbing is ``simrig.vllm_parts.scheduler``, built
by ``real_scheduler`` with the sampling mappings of ``simrig.vllm_sampling``. See docs/recording.md.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simrig.sources.sampler import SyntheticSampler
from simrig.sources.workloads import WorkloadRequest, assign_sampling
from simrig.step import SYNTH_VOCAB_SIZE, Step
from simrig.trace_io.trace import TraceHeader, TraceWriter
from simrig.vllm_parts import scheduler as vs
from simrig.vllm_sampling.from_vllm import recorded_spec
from simrig.vllm_sampling.sampling_params import sampling_params


@dataclass(frozen=True)
class StepTimeModel:
    base_ms: float = 12.0
    per_token_ms: float = 0.06

    def seconds(self, num_tokens: int) -> float:
        return (self.base_ms + self.per_token_ms * num_tokens) / 1000.0


@dataclass
class TraceStats:
    """What a stream of steps exercised (counted from the Steps alone)."""

    steps: int = 0
    requests: int = 0  # distinct request ids
    finished: int = 0
    preemptions: int = 0
    resumptions: int = 0  # a preempted id scheduled again as a new request
    chunked_prefill_steps: int = 0  # a prefill stopped short of its end
    spec_decode_steps: int = 0
    draft_tokens: int = 0
    rejected_tokens: int = 0
    prefix_cache_hits: int = 0  # first admissions with num_computed_tokens > 0
    prefix_cache_hit_tokens: int = 0
    max_batch_reqs: int = 0
    scheduled_tokens: int = 0
    _prefill_len: dict[str, int] = field(default_factory=dict, repr=False)
    _seen: set[str] = field(default_factory=set, repr=False)
    _preempted: set[str] = field(default_factory=set, repr=False)

    def add(self, step: Step) -> None:
        self.steps += 1
        self.finished += len(step.finished)
        self.preemptions += len(step.preempted)
        self._preempted.update(step.preempted)
        computed: dict[str, int] = {}
        for r in step.new_requests:
            if r.req_id in self._preempted:
                self.resumptions += 1
                self._preempted.discard(r.req_id)
            elif r.req_id not in self._seen and r.num_computed_tokens:
                self.prefix_cache_hits += 1
                self.prefix_cache_hit_tokens += r.num_computed_tokens
            self._seen.add(r.req_id)
            self._prefill_len[r.req_id] = r.num_prefill_tokens
            computed[r.req_id] = r.num_computed_tokens
        for c in step.cached:
            computed[c.req_id] = c.num_computed_tokens
        chunked = False
        for req_id, n in step.num_scheduled_tokens.items():
            end = self._prefill_len.get(req_id, 0)
            start = computed.get(req_id, end)
            if start < end and start + n - step.spec_tokens.get(req_id, 0) < end:
                chunked = True
        self.chunked_prefill_steps += chunked
        if step.spec_tokens:
            self.spec_decode_steps += 1
            self.draft_tokens += sum(step.spec_tokens.values())
        self.rejected_tokens += sum(step.rejected.values())
        self.max_batch_reqs = max(self.max_batch_reqs, len(step.num_scheduled_tokens))
        self.scheduled_tokens += step.total_num_scheduled_tokens
        self.requests = len(self._seen)


def stats_of(steps) -> TraceStats:
    stats = TraceStats()
    for step in steps:
        stats.add(step)
    return stats


@dataclass
class RecordResult:
    stats: TraceStats
    requests_admitted: int
    requests_total: int
    simulated_s: float
    wall_s: float
    scheduler_s: float  # time inside schedule() + update_from_output()
    setup_s: float = 0.0  # engine config + Scheduler construction

    @property
    def steps_per_s(self) -> float:
        return self.stats.steps / self.wall_s if self.wall_s else 0.0


def record(scheduler: Any, workload: list[WorkloadRequest], sampler: SyntheticSampler,
           sink: Callable[[Step], None], *, max_steps: int | None = None,
           time_model: StepTimeModel = StepTimeModel(), time_scale: float = 1.0,
           max_idle_steps: int = 1000) -> RecordResult:
    """Drive ``scheduler`` (a ``vllm_scheduler.RealScheduler``) until the workload
    drains or ``max_steps`` steps were recorded; every Step goes to ``sink``.

    One loop, on a simulated clock:

        clock t ─► admit every request with arrival_s <= t (add_request)
                ─► schedule()                    real vLLM Scheduler -> Step
                ─► synthetic sampler             sampled tokens, rejected drafts
                ─► update_from_output(...)       real; then the drafter's proposals
                ─► Step (+ rejected) ─► TraceWriter
                ─► t += step_time(tokens)        modelled step duration

    The step-duration model: ``base_ms + per_token_ms * scheduled tokens``
    (defaults 12 ms + 0.06 ms/token, a mid-size model on one GPU). When nothing
    is running and the next arrival lies ahead, the clock jumps to it (idle time
    records no steps). ``time_scale`` multiplies arrival times (0.5 = arrivals
    twice as dense).

    The scheduler-side plumbing lives in ``simrig.vllm_parts.scheduler`` (adapter).
    """
    pending = sorted(workload, key=lambda r: r.arrival_s)
    stats = TraceStats()
    clock, next_i, sched_s, idle = 0.0, 0, 0.0, 0
    start = time.perf_counter()
    while max_steps is None or stats.steps < max_steps:
        if not scheduler.has_unfinished():
            if next_i >= len(pending):
                break
            clock = max(clock, pending[next_i].arrival_s * time_scale)
        while next_i < len(pending) and pending[next_i].arrival_s * time_scale <= clock:
            r = pending[next_i]
            scheduler.add(r.req_id, r.token_ids(), r.max_tokens, r.arrival_s * time_scale, r.lora_id,
                          sampling=r.sampling)
            next_i += 1
        t0 = time.perf_counter()
        step, so = scheduler.schedule()
        result = sampler.sample(step, scheduler.progress)
        step.rejected = {k: v for k, v in result.rejected.items() if v}
        scheduler.complete(so, result.sampled)
        scheduler.propose_drafts(sampler.drafts(list(step.num_scheduled_tokens), scheduler.progress))
        sched_s += time.perf_counter() - t0
        if not step.num_scheduled_tokens and not step.finished and not step.preempted:
            # Nothing for a runner to do (e.g. all waiting requests blocked):
            # advance time without writing an empty step.
            idle += 1
            if idle > max_idle_steps:
                raise RuntimeError("scheduler made no progress for "
                                   f"{max_idle_steps} steps (num_kv_blocks too small for one request?)")
            nxt = pending[next_i].arrival_s * time_scale if next_i < len(pending) else clock
            clock = max(clock + time_model.seconds(0), nxt)
            continue
        idle = 0
        sink(step)
        stats.add(step)
        clock += time_model.seconds(step.total_num_scheduled_tokens)
    return RecordResult(stats=stats, requests_admitted=next_i, requests_total=len(pending),
                        simulated_s=clock, wall_s=time.perf_counter() - start, scheduler_s=sched_s)


def real_scheduler(setup: vs.SchedulerSetup) -> vs.RealScheduler:
    """vLLM's real Scheduler for ``setup``: a request's spec becomes its SamplingParams, and
    each new request's SamplingParams its Step's spec, less the recorder's own stop id (the
    synthetic sampler's way of ending a request, no parameter of the request)."""
    return vs.RealScheduler(setup, params_of=sampling_params, spec_of=functools.partial(
        recorded_spec, vocab_size=SYNTH_VOCAB_SIZE, drop_stop_ids=(vs.STOP_TOKEN_ID,)))


def record_to_file(path: str, setup: Any, workload: list[WorkloadRequest], *, spec: str,
                   seed: int, acceptance_rate: float, eos_prob: float,
                   max_steps: int | None = None, time_scale: float = 1.0,
                   source_kind: str = "recorded", tool: str = "simrig record",
                   extra_source: dict | None = None, sampling_mix: str = "none") -> RecordResult:
    """Build a real scheduler for ``setup`` and stream the trace to ``path``
    (written atomically: an error leaves no file behind). ``sampling_mix``: each request's
    sampling parameters from that mix (``workloads.SAMPLING_MIXES``; "none" keeps theirs)."""
    assign_sampling(workload, sampling_mix)
    t0 = time.perf_counter()
    scheduler = real_scheduler(setup)
    setup_s = time.perf_counter() - t0
    sampler = SyntheticSampler(seed=seed, acceptance_rate=acceptance_rate, eos_prob=eos_prob,
                               stop_token_id=vs.STOP_TOKEN_ID,
                               num_speculative_tokens=setup.num_speculative_tokens)
    source = {"kind": source_kind, "tool": tool, "vllm_version": vs.vllm_version(),
              "workload": spec, "seed": seed, "num_kv_blocks": setup.num_kv_blocks,
              "prefix_caching": setup.prefix_caching, "acceptance_rate": acceptance_rate,
              "eos_prob": eos_prob, "time_scale": time_scale}
    if setup.max_loras and not any(r.lora_id for r in workload):
        # LoRA on, a workload without adapters: twice as many adapters as a batch holds
        from simrig.sources.workloads import assign_adapters

        assign_adapters(workload, 2 * setup.max_loras, seed)
        source["lora_adapters"] = 2 * setup.max_loras
    if sampling_mix != "none":  # absent: a trace recorded before mixes reads the same
        source["sampling_mix"] = sampling_mix
    source.update(extra_source or {})
    header = TraceHeader(config=setup.runner_config(), source=source)
    with TraceWriter(path, header) as writer:
        result = record(scheduler, workload, sampler, writer.write, max_steps=max_steps,
                        time_scale=time_scale)
    result.setup_s = setup_s
    return result


def record_and_print(path: str, workload: list[WorkloadRequest], clamped: int, **options: Any
                     ) -> RecordResult:
    """``record_to_file(path, workload=workload, **options)``, then what ``simrig record`` and
    ``simrig import`` print: the trace's steps, requests and scheduler events, and the times."""
    start = time.perf_counter()
    result = record_to_file(path, workload=workload, **options)
    wall_s = time.perf_counter() - start
    s = result.stats
    print(f"wrote {path}: {s.steps} steps, {s.requests} requests "
          f"({result.requests_admitted}/{result.requests_total} admitted, {s.finished} finished)")
    print(f"  preemptions {s.preemptions}, resumptions {s.resumptions}, "
          f"chunked-prefill steps {s.chunked_prefill_steps}, spec-decode steps {s.spec_decode_steps} "
          f"({s.draft_tokens} drafts, {s.rejected_tokens} rejected)")
    print(f"  prefix-cache hits {s.prefix_cache_hits} ({s.prefix_cache_hit_tokens} tokens), "
          f"max batch {s.max_batch_reqs} requests, {s.scheduled_tokens} tokens scheduled"
          + (f", {clamped} requests clamped to --max-model-len" if clamped else ""))
    print(f"  simulated {result.simulated_s:.1f} s; wall {wall_s:.1f} s (scheduler setup {result.setup_s:.1f} s), "
          f"scheduler loop {result.scheduler_s:.2f} s ({s.steps / max(result.scheduler_s, 1e-9):.0f} steps/s)")
    return result


def continuity_problems(steps) -> list[str]:
    """Where a cached request's num_computed_tokens breaks the rule
    ``computed[k+1] = computed[k] + scheduled[k] - rejected[k]`` (the rule the
    harness's sampler stand-in relies on). Empty for a consistent trace."""
    expect: dict[str, int] = {}
    problems = []
    for i, step in enumerate(steps):
        for req_id in (*step.finished, *step.preempted):
            expect.pop(req_id, None)
        computed = {r.req_id: r.num_computed_tokens for r in step.new_requests}
        for c in step.cached:
            want = expect.get(c.req_id)
            if want is not None and c.num_computed_tokens != want:
                problems.append(f"step {i}: {c.req_id}: num_computed_tokens "
                                f"{c.num_computed_tokens}, expected {want}")
            computed[c.req_id] = c.num_computed_tokens
        for req_id in step.num_scheduled_tokens:
            if req_id in computed:
                expect[req_id] = computed[req_id] + step.num_accepted(req_id)
    return problems
