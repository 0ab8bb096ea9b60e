"""What each stage of ``execute_model`` records: the harness's probes.

``Probes`` wraps the runner's own methods on the instance (``simrig.adapters.probes.wrap``);
each probe calls vLLM's current function with vLLM's arguments, records what it saw on the
step in flight (``simrig.step_context.StepContext``) and returns vLLM's result unchanged.
An exception is recorded on the stage that raised it and re-raised, so ``execute_model``
stops where the real runner stops. In the dummy paths the probes pass through.
The stage each probe records: docs/layout.md, 'The step path'.
"""

from __future__ import annotations

import time
from typing import Any

from simrig import lifeline
from simrig import observe as obs
from simrig.adapters import sampling
from simrig.adapters.probes import added_state, attn_fields, descriptor_fields, error_obs, lora_fields
from simrig.adapters.probes import observe_batch, pcp_private_view, wrap
from simrig.step import Step
from simrig.step_context import StepContext
from simrig.trace_gate import rig_work, vllm_calls
from simrig.vllm_parts import cudagraph


class StopStep(Exception):
    """Raised by a probe when the stages the user asked for are done."""


class Probes:
    """The probes on one runner, recording into ``ctx``.

        finish_requests .. update_requests   lifecycle (the runner's live set and slots)
        gather_batch_req_state               gather
        CudaGraphManager.dispatch            dispatch (the descriptor, the sizes in force)
        prepare_inputs / partition_batch     prepare (the global batch), partition rank 0
        prepare_attn                         block tables and slot mappings, on the
                                             record of the batch the forward runs
        _set_active_loras                    the LoRA mapping (lora.*), on the same record
        postprocess_sampled                  postprocess (sampled and rejected counts)
    """

    def __init__(self, ctx: StepContext, api: Any, runner: Any, stages: frozenset[str],
                 pcp_size: int):
        self.ctx, self.api, self.runner, self.stages = ctx, api, runner, stages
        self.pcp_size = pcp_size  # the PCP world actually driven (0: none)
        self._lifecycle_start = 0.0

    def install(self) -> None:
        """Wrap the runner's methods (each wrapper calls the class's current function,
        so a mutated vLLM is what runs)."""
        runner = self.runner
        for owner, name, probe in (
                (runner, "finish_requests", self._lifecycle_start_probe),
                (runner, "update_requests", self._lifecycle_end_probe),
                (runner, "gather_batch_req_state", self._gather_probe),
                (runner.cudagraph_manager, "dispatch", self._dispatch_probe),
                (runner, "prepare_inputs", self._prepare_probe),
                (runner, "prepare_attn", self._attn_probe),
                (runner, "postprocess_sampled", self._postprocess_probe),
                (runner.pcp_manager, "partition_batch", self._partition_probe),
                # LoRA's per-request and per-token adapter mapping (only with LoRA on)
                (runner if runner.lora_config is not None else None, "_set_active_loras",
                 self._lora_probe)):
            if owner is not None:
                wrap(owner, name, self._gated(probe))

    def _gated(self, probe: Any) -> Any:
        """Probes record real steps only; in vLLM's dummy paths they pass through
        (the dummy run's descriptor is kept on its record)."""
        ctx = self.ctx
        is_dispatch = probe == self._dispatch_probe

        def run(call: Any, *args: Any, **kwargs: Any) -> Any:
            outer, inner = time.perf_counter(), 0.0

            def real(*a: Any, **k: Any) -> Any:
                nonlocal inner
                start = time.perf_counter()
                try:
                    with vllm_calls():
                        return call(*a, **k)
                finally:
                    inner += time.perf_counter() - start
            try:
                if ctx.mode == "step":
                    with rig_work():  # under coverage: the probe's own work is not traced
                        return probe(real, *args, **kwargs)
                value = real(*args, **kwargs)
                if is_dispatch and ctx.dummy_record is not None:
                    ctx.dummy_record.fields.update(descriptor_fields(value, "desc."))
                return value
            finally:
                ctx.probe_rig_s += time.perf_counter() - outer - inner
        return run

    def rig_timed(self, observer: Any) -> Any:
        """An observer vLLM calls back (the model-state stand-in's prepare_attn):
        its time is the rig's, not vLLM's."""
        ctx = self.ctx

        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                with rig_work():
                    return observer(*args, **kwargs)
            finally:
                ctx.probe_rig_s += time.perf_counter() - start
        return run

    def _lifecycle_start_probe(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        lifeline.mark_stage(obs.LIFECYCLE)
        record = obs.StageObs(stage=obs.LIFECYCLE)
        self.ctx.result.stages.append(record)
        self._lifecycle_start = time.perf_counter()
        try:
            return self._claim(record, call, *args, **kwargs)
        except Exception:
            record.duration_s = time.perf_counter() - self._lifecycle_start
            raise

    def _lifecycle_end_probe(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        ctx, runner = self.ctx, self.runner
        record = ctx.result.stages[-1]
        try:
            value = self._claim(record, call, *args, **kwargs)
        finally:  # lifecycle spans finish_requests .. update_requests
            record.duration_s = time.perf_counter() - self._lifecycle_start
        # the drafter stand-in writes the step's draft token ids into req_states
        sampling.write_drafts(self.api, runner, ctx.step)
        held = runner.req_states.req_id_to_index  # the runner's live set and slots (checks/fields.py)
        ids = sorted(held)
        record.fields = {k: obs.observe_value(v) for k, v in {
            "runner.live_ids": ids, "runner.live_slots": [held[r] for r in ids],
            "runner.free_slots": list(runner.req_states.free_indices),
            # the PCP world actually driven (1 where the release cannot drive the config)
            "runner.pcp_size": self.pcp_size or 1,
            # each request this step added, as the runner keeps it (checks/readded.py)
            **added_state(runner, ctx.step)}.items()}
        if obs.GATHER not in self.stages:
            raise StopStep
        return value

    def _gather_probe(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        record = self.ctx.open(obs.GATHER)
        value = self._claim(record, call, *args, **kwargs, timed=True)
        batch_state, uniform = value
        if batch_state is not None:
            record.fields = obs.observe_fields(batch_state)
            record.fields["uniform_decode_token_count"] = obs.observe_value(uniform)
            record.declared = obs.declared_fields(batch_state) | {"uniform_decode_token_count"}
        return value

    def _dispatch_probe(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        record = self.ctx.open(obs.DISPATCH)
        desc = self._claim(record, call, *args, **kwargs, timed=True)
        record.fields = descriptor_fields(desc)
        manager = self.runner.cudagraph_manager
        if manager.cudagraph_mode:  # the sizes in force, for the oracle (eager mode has none)
            record.fields[obs.CAPTURE_SIZES] = obs.observe_value(cudagraph.capture_sizes(manager))
        self.ctx.desc = desc
        if obs.PREPARE not in self.stages:
            raise StopStep
        return desc

    def _prepare_probe(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        record = self.ctx.open(obs.PREPARE)
        batch = self._claim(record, call, *args, **kwargs, timed=True)
        if self.ctx.global_batch is None:  # no PCP: prepare_inputs returns the global batch
            self.ctx.global_batch = batch
            observe_batch(record, batch)
        return batch

    def _partition_probe(self, call: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        """PCP rank 0's partition inside prepare_inputs: its input is the global batch."""
        ctx = self.ctx
        ctx.global_batch = input_batch
        prepare = ctx.result.get(obs.PREPARE)
        if prepare is not None:
            observe_batch(prepare, input_batch)
        if obs.PARTITION not in self.stages:
            return call(input_batch, *args, **kwargs)
        record = ctx.open(obs.PARTITION, rank=0)
        value = self._claim(record, call, input_batch, *args, **kwargs, timed=True)
        observe_batch(record, value)
        record.fields.update(pcp_private_view(self.runner.pcp_manager))
        record.declared = (record.declared or frozenset()) | {"manager"}
        return value

    def _attn_probe(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """prepare_attn's block tables and slot mappings, on the batch they
        describe (the rank-local one under PCP)."""
        record = forward_record(self.runner, self.ctx.result)
        if record is None:
            return call(*args, **kwargs)
        value = self._claim(record, call, *args, **kwargs)
        record.fields.update(attn_fields(*value))
        if record.declared is not None:
            record.declared |= {"attn"}
        return value

    def _postprocess_probe(self, call: Any, idx_mapping: Any, sampled: Any, num_sampled: Any,
                           num_rejected: Any, *args: Any, **kwargs: Any) -> Any:
        record = self.ctx.result.get(obs.POSTPROCESS)
        if record is not None:
            record.fields.update({"num_sampled": obs.observe_value(num_sampled),
                                  "num_rejected": obs.observe_value(num_rejected),
                                  "sampled_tokens": obs.observe_value(sampled)})
        value = call(idx_mapping, sampled, num_sampled, num_rejected, *args, **kwargs)
        if record is not None:
            # what postprocess wrote back into each row's request state
            record.fields.update(_written_back(self.runner.req_states, idx_mapping))
        return value

    def _lora_probe(self, call: Any, prompt_mapping: Any, token_mapping: Any, lora_requests: Any,
                    *args: Any, **kwargs: Any) -> Any:
        """What execute_model hands the LoRA manager (LoraState.make_lora_inputs), on the
        record of the batch it was built from (the rank-local one under PCP)."""
        record = forward_record(self.runner, self.ctx.result)
        if record is not None:
            record.fields.update(lora_fields(prompt_mapping, token_mapping, lora_requests))
        return call(prompt_mapping, token_mapping, lora_requests, *args, **kwargs)

    def _claim(self, record: obs.StageObs, call: Any, *args: Any, timed: bool = False,
               **kwargs: Any) -> Any:
        """Run the real call; an exception is recorded on ``record`` and re-raised
        (execute_model stops there, as it would in vLLM)."""
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        except StopStep:
            raise
        except Exception as exc:
            if record.error is None and not getattr(exc, "__simrig_claimed__", False):
                record.error = error_obs(exc, self.ctx.step)
            exc.__simrig_claimed__ = True  # type: ignore[attr-defined]
            raise
        finally:
            if timed:
                record.duration_s = time.perf_counter() - start


def record_unclaimed(exc: Exception, step: Step, result: obs.StepObs) -> None:
    """An exception from execute_model's own code between the probed calls (no probe
    recorded it): recorded on the stage that ran last."""
    if getattr(exc, "__simrig_claimed__", False):
        return
    stage = result.stages[-1].stage if result.stages else obs.LIFECYCLE
    result.stages.append(obs.StageObs(stage=stage, rank=None, error=error_obs(exc, step)))


def forward_record(runner: Any, result: obs.StepObs) -> obs.StageObs | None:
    """The record of the batch the forward runs: PCP rank 0's rank-local
    partition under PCP, else the global batch prepare_inputs returned."""
    stage, rank = (obs.PARTITION, 0) if runner.pcp_manager is not None else (obs.PREPARE, None)
    return result.get(stage, rank)


def observe_dcp_local_seq_lens(runner: Any, result: obs.StepObs) -> None:
    """execute_model fills dcp_local_seq_lens after prepare_attn, on the batch the
    forward runs (rank-local under PCP)."""
    state = runner.execute_model_state
    if state is None or getattr(state.input_batch, "dcp_local_seq_lens", None) is None:
        return
    record = forward_record(runner, result)
    if record is not None:
        record.fields["dcp_local_seq_lens"] = obs.observe_value(state.input_batch.dcp_local_seq_lens)


def _written_back(states: Any, idx_mapping: Any) -> dict[str, obs.FieldObs]:
    """Each batch row's request state after postprocess_sampled: its last sampled
    token and its computed-token count (rows masked with a negative slot: -1)."""
    slots = idx_mapping.detach().cpu().long()
    keep = slots >= 0
    safe = slots.clamp(min=0)
    last = states.last_sampled_tokens.detach().cpu().reshape(-1)[safe].masked_fill(~keep, -1)
    computed = states.num_computed_tokens.gpu.detach().cpu()[safe].masked_fill(~keep, -1)
    return {"post.last_sampled_tokens": obs.observe_value(last),
            "post.num_computed_tokens": obs.observe_value(computed)}
