"""The runner harness: applies Steps through the real MRV2 code, one module top to bottom.

Each step is one call of the installed ``GPUModelRunner.execute_model``, vLLM's own wiring
deciding every argument; the runner comes built and equipped from the adapter
(``VllmApi.build_parts``). ``Harness`` observes by wrapping (``simrig.stage_probes.Probes``)
and never changes an argument or a result. See docs/layout.md, 'The step path'.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from simrig import observe as obs
from simrig.vllm_runtime import platform
from simrig.adapters import pp_peer, sampling
from simrig.adapters.probes import error_obs, pcp_private_view
from simrig.adapters.reuse import RunnerState
from simrig.adapters.runner import VllmApi, load
from simrig.dummy_paths import DummyRuns
from simrig.findings.findings import Finding, rig_error
from simrig.sampling.logits import drafting, sampler_mode
from simrig.stage_probes import Probes, StopStep, observe_dcp_local_seq_lens, record_unclaimed
from simrig.step import RunnerConfig, Step
from simrig.step_context import StepContext
from simrig.trace_gate import vllm_calls
from simrig.vllm_parts import ubatch
from simrig.vllm_sampling.feed import SpreadFeed, histories
from simrig.vllm_sampling.bitmask import grammar_output
from simrig.vllm_sampling.spec_decode import SpreadDrafts


class Harness:
    """A model-less runner built from the installed vLLM, fed one Step at a time.

    It composes the step in flight (``ctx``: ``simrig.step_context.StepContext``), the
    probes that record into it (``probes``) and vLLM's dummy paths (``dummies``:
    ``simrig.dummy_paths.DummyRuns``). ``run_step``, stage by stage:

        Step --vllm_api--> SchedulerOutput --> runner.execute_model(so)
          profile     before the first step: profile_run's batch (dummies)
          capture     then capture_model: each captured descriptor's dummy batch
          lifecycle   finish_requests ... update_requests (real); the drafter
                      stand-in then writes draft token ids into req_states
          gather      gather_batch_req_state                    -> BatchReqState
          dispatch    CudaGraphManager.dispatch, as dispatch_cg_and_sync_dp calls it
                                                                -> BatchExecutionDescriptor
          prepare     prepare_inputs (the global batch: what PCP rank 0's
                      partition_batch receives under PCP), plus prepare_attn's
                      block tables and slot mappings, and dcp_local_seq_lens
          partition   rank 0: inside prepare_inputs; ranks past 0 (and DCP peers)
                      partition the same global batch as the release does
          ubatch      under micro-batching: vLLM's split decision and slices
          postprocess the release's sample_tokens (stand-in logits and samplers,
                      adapters/sampling.py): postprocess_sampled's counts and the
                      runner's output to the scheduler
          pipeline    pp_size > 1: the non-last PP rank's step (adapters/pp_peer.py)
          dummy       _dummy_run at the step's token count, in the runner's own
                      buffers (dummies); not after a step whose ``idle_dummy`` is False

    An exception stops the step where the real runner stops (the dummy still runs:
    cudagraph capture builds it independently). Nothing is raised out of ``run_step``:
    every exception becomes part of the observation.
    """

    def __init__(self, config: RunnerConfig, stages: Iterable[str] = obs.OPTIONAL_STAGES,
                 api: VllmApi | None = None):
        config.validate()
        stages = frozenset(stages)
        unknown = stages - set(obs.OPTIONAL_STAGES)
        if unknown:
            raise ValueError(f"stages: unknown stage(s) {sorted(unknown)}; "
                             f"choose from {', '.join(obs.OPTIONAL_STAGES)}")
        self.config = config
        self.stages = stages
        self.api = api or load()
        built = time.perf_counter()
        with vllm_calls():  # under coverage: the build is vLLM's code, traced
            parts = self.api.build_parts(config)  # built and equipped in the adapter (adapters/wiring.py)
        # vLLM's constructors (config, block tables, managers, runner, KV cache): booked
        # to vLLM on the first step, with the profile run and capture that follow them
        self._build_s = time.perf_counter() - built
        self.runner, self.dispatcher, self.dummy_buffers = parts.runner, parts.dispatcher, parts.dummy_buffers
        self.pcp_managers, self.dcp_peers = parts.pcp_managers, parts.dcp_peers
        # pp_size > 1: the non-last PP rank, stepped after this (the last) rank
        self.pp_mailbox = parts.pp_mailbox
        self.pp_rank = (pp_peer.NonLastRank(parts.pp_peer, parts.pp_mailbox)
                        if parts.pp_peer is not None else None)
        self.num_steps = 0
        # the first step at which vLLM raised on this runner: every later step reports it,
        # and the runner pool never resets such a runner for another example
        self.raised_at: int | None = None
        self.ctx = StepContext()
        self.feed = SpreadFeed(drafting(config))  # the requests with sampling parameters
        self.spread_drafts = SpreadDrafts(self.feed, self.runner.vocab_size)  # their drafts, if spread
        if getattr(self.runner, "speculator", None) is not None:
            self.runner.speculator.spread_drafts = self.spread_drafts  # read by adapters' write_drafts
        self.probes = Probes(self.ctx, self.api, self.runner, stages, len(self.pcp_managers))
        self.dummies = DummyRuns(self.ctx, self.runner, stages)
        # reuse (simrig.runners): the state after start-up, kept when asked for
        self.keep_startup_state = False
        self.pool_key: tuple | None = None
        self._startup_state: Any = None
        self._startup_stages: list[obs.StageObs] = []
        self._report_startup = False
        self.runner.model_state.observer = self.probes.rig_timed(self.dummies.on_attn)
        self.probes.install()
        self._dispatch_tap = ubatch.install_dispatch_tap(self.runner)

    # The hot path: one real execute_model, then the ranks it does not drive.
    def run_step(self, step: Step) -> obs.StepObs:
        with vllm_calls():  # under coverage: traced, but for the probes' own work
            result = self._run_step(step)
        result.after_exception = self.raised_at
        if self.raised_at is None and result.errors:
            self.raised_at = result.index
        return result

    def _run_step(self, step: Step) -> obs.StepObs:
        result = obs.StepObs(index=self.num_steps)
        self.num_steps += 1
        self.feed.learn(step)  # before the SchedulerOutput: a resumed request re-sends its tokens
        self.spread_drafts.learn(step)
        so = self.api.scheduler_output(step, self.config.num_kv_groups)
        if self.pp_rank is not None and hasattr(so, "num_spec_tokens_to_schedule"):
            # the drafts the last rank proposes are what the other PP ranks embed: K, as
            # vLLM's Scheduler sets it ("num_spec_tokens_to_schedule = self.num_spec_tokens")
            so.num_spec_tokens_to_schedule = self.config.num_speculative_tokens
        ctx = self.ctx
        ctx.begin(step, result)
        start = time.perf_counter()
        if not self.dummies.captured:
            self._start_up(result)
        elif self._report_startup:
            self._report_startup = False
            result.stages.extend(dataclasses.replace(st, fields=dict(st.fields), duration_s=0.0)
                                 for st in self._startup_stages)
        self._dispatch_tap.calls.clear()
        self._dispatch_tap.armed = True
        try:
            self.runner.execute_model(so)
        except StopStep:
            pass
        except Exception as exc:  # vLLM's exceptions are observations
            record_unclaimed(exc, step, result)
        finally:
            self._dispatch_tap.armed = False
        in_execute = time.perf_counter() - start
        staged = len(result.stages)
        observe_dcp_local_seq_lens(self.runner, result)
        self._micro_batches(step, result)
        batch, desc = ctx.global_batch, ctx.desc
        try:
            if batch is not None and desc is not None and obs.PREPARE in self.stages \
                    and not result.step_failed():
                self._other_ranks(step, batch, desc, result)
                grammar = self._sample_tokens(step, batch, result)
                if self._pp_in_step():
                    self._timed_stage(result, self.pp_rank.step, so, self.runner, batch, step, grammar)
            elif self._pp_in_step() and not step.num_scheduled_tokens and not result.step_failed():
                # a step with no forward still advances the non-last rank's broadcast ring
                self._timed_stage(result, self.pp_rank.step, so, self.runner, None, step)
        finally:
            self.runner.execute_model_state = None
        self.dummies.after_step(step, result, desc)
        # startup and execute_model whole, then the calls after it (their stage rows)
        result.vllm_s = max(0.0, in_execute + sum(st.duration_s for st in result.stages[staged:])
                            - ctx.probe_rig_s) + self._build_s
        self._build_s = 0.0
        return result

    # ---------------------------------------------------------------- reuse
    def _start_up(self, result: obs.StepObs) -> None:
        """Profile and capture (simrig.dummy_paths); with keep_startup_state,
        the runner's state right after them is kept for ``reset``."""
        first = len(result.stages)
        self.dummies.start_up(result)
        failed = self.pp_rank.start_up(self.ctx.step) if self.pp_rank is not None else None
        if failed is not None:
            result.stages.append(failed)
        self._startup_stages = list(result.stages[first:])
        if self.keep_startup_state:
            self._startup_state = RunnerState(self._state_roots())

    def _state_roots(self) -> list[Any]:
        peer = [self.pp_rank.runner, self.pp_mailbox] if self.pp_rank is not None else []
        return [self.runner, self.pcp_managers, self.dcp_peers, self.dispatcher, self.dummy_buffers, *peer]

    @property
    def resettable(self) -> bool:
        """Never stepped (as built), or its state after start-up was kept."""
        return self.num_steps == 0 or self._startup_state is not None

    def reset(self) -> list[str]:
        """Put the runner back as it was right after start-up, and check it:
        returns what still differs (empty: clean, as a fresh build would be at
        its first step, whose start-up observations it reports again)."""
        if not self.resettable:
            return ["the state after start-up was not kept (keep_startup_state off)"]
        if self.num_steps == 0:
            return []  # never stepped: as built
        self._startup_state.restore()
        dirty = self._startup_state.differences()
        if not dirty:
            self.num_steps = 0
            self.raised_at = None
            self.feed.clear()
            self.ctx.begin(None, None)
            self._report_startup = True
        return dirty

    def _other_ranks(self, step: Step, batch: Any, desc: Any, result: obs.StepObs) -> None:
        """PCP ranks past 0 and every DCP peer partition the same global batch."""
        if obs.PARTITION not in self.stages:
            return
        for rank, manager in enumerate(self.pcp_managers[1:], start=1):
            self._timed(result, obs.PARTITION, rank, step, self.api.partition_for_rank,
                        manager, batch, desc, extra=lambda _fn, m=manager: pcp_private_view(m))
        for rank, dcp_rank, manager in self.dcp_peers:
            self._timed(result, obs.PARTITION, rank, step, self.api.partition_for_rank,
                        manager, batch, desc, extra=lambda _fn, m=manager: pcp_private_view(m))
            result.stages[-1].dcp_rank = dcp_rank

    def _micro_batches(self, step: Step, result: obs.StepObs) -> None:
        """The ``uniform_decode`` flag execute_model handed to the dispatch (on the
        dispatch record), and under a micro-batch config vLLM's own split decision and
        slicing of the batch the forward ran (simrig.vllm_parts.ubatch)."""
        calls = self._dispatch_tap.calls
        record = result.get(obs.DISPATCH)
        if not calls or record is None:
            return
        record.fields["uniform_decode"] = obs.observe_value(ubatch.uniform_decode_flag(calls[0]))
        state = self.runner.execute_model_state
        config = self.config
        if config.num_ubatches < 2 or state is None or result.step_failed():
            return
        split = self.ctx.open(obs.UBATCH)
        start = time.perf_counter()
        try:
            with vllm_calls(), self.ctx.passing_through("ubatch"):
                desc = ubatch.decide(self.runner, calls[0], config.num_ubatches,
                                     config.dbo_decode_token_threshold, config.dbo_prefill_token_threshold)
                split.fields["desc.num_ubatches"] = obs.observe_value(int(desc.num_ubatches))
                if desc.num_ubatches > 1:
                    split.fields.update(ubatch.split(self.runner, state.input_batch, int(desc.num_ubatches)))
        except Exception as exc:  # vLLM's exceptions are observations
            split.error = error_obs(exc, step)
        finally:
            split.duration_s = time.perf_counter() - start

    def _sample_tokens(self, step: Step, batch: Any, result: obs.StepObs) -> Any:
        """The release's own sample_tokens on the state execute_model left: the
        stand-in logits name the trace's tokens for the global batch's logit
        rows, the step's grammar is vLLM's GrammarOutput (returned, for the other
        PP rank); postprocess_sampled's arguments and the runner's output to the
        scheduler are observed."""
        record = self.ctx.open(obs.POSTPROCESS)
        self.runner.model.target_tokens = sampling.target_tokens(batch)
        rows = self.feed.rows(batch)
        self.runner.model.spread_rows = self.feed.logits(rows, self.runner.vocab_size)
        switch = self.runner.sampler
        if hasattr(switch, "use_real"):  # vllm_sampling.switch.SamplerSwitch
            switch.use_real = bool(rows) or sampler_mode() == "always"
        grammar = grammar_output(step, self.feed.given, self.runner.vocab_size, self.runner.decode_query_len)
        start = time.perf_counter()
        try:
            with platform.streams_without_cuda(), platform.pcp_group(max(len(self.pcp_managers), 1)), \
                    pp_peer.collectives(self.pp_mailbox):
                output = self.runner.sample_tokens(grammar)
                if output is not None and hasattr(output, "get_output"):
                    output = output.get_output()
        except Exception as exc:  # vLLM's exceptions are observations
            record.error = error_obs(exc, step)
            return grammar
        finally:
            record.duration_s = time.perf_counter() - start
            self.runner.model.target_tokens = self.runner.model.spread_rows = None
        if hasattr(switch, "take_rows"):  # what vLLM's sampler made, and each request's stored history
            result.sampled = {"rows": [(row, req_id, pos) for row, (req_id, pos) in rows.items()],
                              "calls": switch.take_rows(), "history": histories(self.runner, batch),
                              "logprobs": getattr(output, "logprobs", None),
                              "prompt_logprobs": getattr(output, "prompt_logprobs_dict", None)}
        if output is not None and getattr(output, "sampled_token_ids", None) is not None:
            self.feed.handed(output.req_ids, output.sampled_token_ids)
            record.fields["output.req_ids"] = obs.observe_value(list(output.req_ids))
            record.fields["output.num_sampled_tokens"] = obs.observe_value(
                [len(tokens) for tokens in output.sampled_token_ids])
            record.fields["output.sampled_token_ids"] = obs.observe_value(
                [list(tokens) for tokens in output.sampled_token_ids])
        return grammar

    def _pp_in_step(self) -> bool:
        """The non-last PP rank steps with this one until vLLM raised here: after that
        the ranks no longer hold the same requests (nothing of it is judged)."""
        return self.pp_rank is not None and self.raised_at is None

    def _timed_stage(self, result: obs.StepObs, fn: Any, *args: Any) -> None:
        """A call that returns its own stage record (the non-last PP rank's step)."""
        start = time.perf_counter()
        record = fn(*args)
        record.duration_s = time.perf_counter() - start
        result.stages.append(record)

    def _timed(self, result: obs.StepObs, stage: str, rank: int | None, step: Step,
               fn: Any, *args: Any, observe: bool = True, extra: Any = None) -> Any:
        """Run one real call, record its duration, fields and any exception.

        Returns the call's value, or None when it raised (a lifecycle call
        returns True on success).
        """
        record = obs.StageObs(stage=stage, rank=rank)
        result.stages.append(record)
        start = time.perf_counter()
        try:
            value = fn(*args)
        except Exception as exc:  # vLLM's exceptions are observations
            record.duration_s = time.perf_counter() - start
            record.error = error_obs(exc, step)
            return None
        record.duration_s = time.perf_counter() - start
        if observe and value is not None:
            if isinstance(value, dict):
                record.fields = {k: obs.observe_value(v) for k, v in value.items()}
            elif type(value) is tuple:  # gather: (BatchReqState, uniform count)
                record.fields = obs.observe_fields(value[0])
                record.fields["uniform_decode_token_count"] = obs.observe_value(value[1])
                record.declared = obs.declared_fields(value[0]) | {"uniform_decode_token_count"}
            else:
                record.fields = obs.observe_fields(value)
                record.declared = obs.declared_fields(value)
            if extra is not None:
                more = extra(fn)
                record.fields.update(more)
                if record.declared is not None:
                    record.declared |= {name.split(".")[0] for name in more}
        return True if value is None else value


def run_step_guarded(harness: Harness, step: Step, trace: str = "") -> tuple[obs.StepObs, list[Finding]]:
    """``harness.run_step(step)``; an exception in simrig's own harness code
    (vLLM's are already observations) comes back as a ``rig_error`` finding
    next to whatever the step observed before it."""
    try:
        return harness.run_step(step), []
    except Exception as exc:  # noqa: BLE001 -- the rig's bug is a finding, never a crash
        index = max(harness.num_steps - 1, 0)
        return obs.StepObs(index=index), [rig_error(exc, step=index, check="harness", trace=trace)]
