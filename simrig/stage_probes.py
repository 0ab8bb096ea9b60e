"""What each stage of ``execute_model`` records: the harness's probes.

The harness (``simrig.harness``) wraps the runner's own methods on the
instance (``simrig.adapters.probes.wrap``): each probe calls vLLM's current
function with the arguments vLLM passed, records what it saw on the step's
observation, and returns vLLM's result unchanged. An exception is recorded on
the stage that raised it and re-raised, so ``execute_model`` stops where the
real runner stops.

    finish_requests .. update_requests   lifecycle (the runner's live set and slots)
    gather_batch_req_state               gather
    CudaGraphManager.dispatch            dispatch (the descriptor, the sizes in force)
    prepare_inputs / partition_batch     prepare (the global batch), partition rank 0
    prepare_attn                         block tables and slot mappings, on the
                                         record of the batch the forward runs
    _set_active_loras                    the LoRA mapping (lora.*), on the same record
    postprocess_sampled                  postprocess (sampled and rejected counts)

In the dummy paths (``simrig.dummy_paths``) the probes pass through.
"""

from __future__ import annotations

import time
from typing import Any

from simrig import lifeline
from simrig import observe as obs
from simrig.adapters import sampling
from simrig.adapters.probes import descriptor_fields as _descriptor_fields
from simrig.adapters.probes import added_state as _added_state
from simrig.adapters.probes import error_obs as _error_obs
from simrig.adapters.probes import attn_fields as _attn_fields
from simrig.adapters.probes import lora_fields as _lora_fields
from simrig.adapters.probes import observe_batch as _observe_batch
from simrig.adapters.probes import pcp_private_view as _pcp_private_view
from simrig.adapters.probes import wrap as _wrap
from simrig.step import Step
from simrig.trace_gate import rig_work, vllm_calls
from simrig.vllm_parts import cudagraph


class StopStep(Exception):
    """Raised by a probe when the stages the user asked for are done."""


class StageProbes:
    """The probe half of ``simrig.harness.Harness`` (it sets ``api``, ``runner``,
    ``stages``, ``pcp_managers`` and the step's ``_step``, ``_result``,
    ``_global_batch``, ``_desc``, ``_mode`` and ``_dummy_record``)."""

    api: Any
    runner: Any
    stages: frozenset[str]
    pcp_managers: list[Any]
    _step: Step | None
    _result: obs.StepObs | None
    _global_batch: Any
    _desc: Any
    _mode: str
    _dummy_record: obs.StageObs | None
    _lifecycle_start: float
    _probe_rig_s: float

    def _install_probes(self) -> None:
        runner = self.runner
        for owner, name, probe in (
                (runner, "finish_requests", self._probe_lifecycle_start),
                (runner, "update_requests", self._probe_lifecycle_end),
                (runner, "gather_batch_req_state", self._probe_gather),
                (runner.cudagraph_manager, "dispatch", self._probe_dispatch),
                (runner, "prepare_inputs", self._probe_prepare),
                (runner, "prepare_attn", self._probe_attn),
                (runner, "postprocess_sampled", self._probe_postprocess),
                (runner.pcp_manager, "partition_batch", self._probe_partition),
                # LoRA's per-request and per-token adapter mapping (only with LoRA on)
                (runner if runner.lora_config is not None else None, "_set_active_loras",
                 self._probe_lora)):
            if owner is not None:
                _wrap(owner, name, self._gated(probe))

    def _gated(self, probe: Any) -> Any:
        """Probes record real steps only; in vLLM's dummy paths they pass through
        (the dummy run's descriptor is kept on its record)."""
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
                if self._mode == "step":
                    with rig_work():  # under coverage: the probe's own work is not traced
                        return probe(real, *args, **kwargs)
                value = real(*args, **kwargs)
                if probe == self._probe_dispatch and self._dummy_record is not None:
                    self._dummy_record.fields.update(_descriptor_fields(value, "desc."))
                return value
            finally:
                self._probe_rig_s += time.perf_counter() - outer - inner
        return run

    def _rig_timed(self, observer: Any) -> Any:
        """An observer vLLM calls back (the model-state stand-in's prepare_attn):
        its time is the rig's, not vLLM's."""
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                with rig_work():
                    return observer(*args, **kwargs)
            finally:
                self._probe_rig_s += time.perf_counter() - start
        return run

    def _probe_lifecycle_start(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        lifeline.mark_stage(obs.LIFECYCLE)
        record = obs.StageObs(stage=obs.LIFECYCLE)
        self._result.stages.append(record)
        self._lifecycle_start = time.perf_counter()
        try:
            return self._claim(record, call, *args, **kwargs)
        except Exception:
            record.duration_s = time.perf_counter() - self._lifecycle_start
            raise

    def _probe_lifecycle_end(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        record = self._result.stages[-1]
        try:
            value = self._claim(record, call, *args, **kwargs)
        finally:  # lifecycle spans finish_requests .. update_requests
            record.duration_s = time.perf_counter() - self._lifecycle_start
        self._write_drafts(self._step)
        held = self.runner.req_states.req_id_to_index  # the runner's live set and slots (checks/fields.py)
        ids = sorted(held)
        record.fields = {k: obs.observe_value(v) for k, v in {
            "runner.live_ids": ids, "runner.live_slots": [held[r] for r in ids],
            "runner.free_slots": list(self.runner.req_states.free_indices),
            # the PCP world actually driven (1 where the release cannot drive the config)
            "runner.pcp_size": len(self.pcp_managers) or 1,
            # each request this step added, as the runner keeps it (checks/readded.py)
            **_added_state(self.runner, self._step)}.items()}
        if obs.GATHER not in self.stages:
            raise StopStep
        return value

    def _probe_gather(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        record = self._open(obs.GATHER)
        value = self._claim(record, call, *args, **kwargs, timed=True)
        batch_state, uniform = value
        if batch_state is not None:
            record.fields = obs.observe_fields(batch_state)
            record.fields["uniform_decode_token_count"] = obs.observe_value(uniform)
            record.declared = obs.declared_fields(batch_state) | {"uniform_decode_token_count"}
        return value

    def _probe_dispatch(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        record = self._open(obs.DISPATCH)
        desc = self._claim(record, call, *args, **kwargs, timed=True)
        record.fields = _descriptor_fields(desc)
        manager = self.runner.cudagraph_manager
        if manager.cudagraph_mode:  # the sizes in force, for the oracle (eager mode has none)
            record.fields[obs.CAPTURE_SIZES] = obs.observe_value(cudagraph.capture_sizes(manager))
        self._desc = desc
        if obs.PREPARE not in self.stages:
            raise StopStep
        return desc

    def _probe_prepare(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        record = self._open(obs.PREPARE)
        batch = self._claim(record, call, *args, **kwargs, timed=True)
        if self._global_batch is None:  # no PCP: prepare_inputs returns the global batch
            self._global_batch = batch
            _observe_batch(record, batch)
        return batch

    def _probe_partition(self, call: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        """PCP rank 0's partition inside prepare_inputs: its input is the global batch."""
        self._global_batch = input_batch
        prepare = self._result.get(obs.PREPARE)
        if prepare is not None:
            _observe_batch(prepare, input_batch)
        if obs.PARTITION not in self.stages:
            return call(input_batch, *args, **kwargs)
        record = self._open(obs.PARTITION, rank=0)
        value = self._claim(record, call, input_batch, *args, **kwargs, timed=True)
        _observe_batch(record, value)
        record.fields.update(_pcp_private_view(self.runner.pcp_manager))
        record.declared = (record.declared or frozenset()) | {"manager"}
        return value

    def _probe_attn(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """prepare_attn's block tables and slot mappings, on the batch they
        describe (the rank-local one under PCP)."""
        record = self._forward_record(self._result)
        if record is None:
            return call(*args, **kwargs)
        value = self._claim(record, call, *args, **kwargs)
        record.fields.update(_attn_fields(*value))
        if record.declared is not None:
            record.declared |= {"attn"}
        return value

    def _open(self, stage: str, rank: int | None = None) -> obs.StageObs:
        lifeline.mark_stage(stage)  # a supervised worker's last stage, if it dies in it
        record = obs.StageObs(stage=stage, rank=rank)
        self._result.stages.append(record)
        return record

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
                record.error = _error_obs(exc, self._step)
            exc.__simrig_claimed__ = True  # type: ignore[attr-defined]
            raise
        finally:
            if timed:
                record.duration_s = time.perf_counter() - start

    def _unclaimed_error(self, exc: Exception, step: Step, result: obs.StepObs) -> None:
        """An exception from execute_model's own code between the probed calls:
        recorded on the stage that ran last."""
        if getattr(exc, "__simrig_claimed__", False):
            return
        stage = result.stages[-1].stage if result.stages else obs.LIFECYCLE
        result.stages.append(obs.StageObs(stage=stage, rank=None, error=_error_obs(exc, step)))

    def _forward_record(self, result: obs.StepObs) -> obs.StageObs | None:
        """The record of the batch the forward runs: PCP rank 0's rank-local
        partition under PCP, else the global batch prepare_inputs returned."""
        stage, rank = (obs.PARTITION, 0) if self.runner.pcp_manager is not None else (obs.PREPARE, None)
        return result.get(stage, rank)

    def _observe_dcp_local_seq_lens(self, result: obs.StepObs) -> None:
        """execute_model fills dcp_local_seq_lens after prepare_attn, on the
        batch the forward runs (rank-local under PCP)."""
        state = self.runner.execute_model_state
        if state is None or getattr(state.input_batch, "dcp_local_seq_lens", None) is None:
            return
        record = self._forward_record(result)
        if record is not None:
            record.fields["dcp_local_seq_lens"] = obs.observe_value(state.input_batch.dcp_local_seq_lens)

    def _write_drafts(self, step: Step) -> None:
        sampling.write_drafts(self.api, self.runner, step)

    def _probe_postprocess(self, call: Any, idx_mapping: Any, sampled: Any, num_sampled: Any,
                           num_rejected: Any, *args: Any, **kwargs: Any) -> Any:
        record = self._result.get(obs.POSTPROCESS)
        if record is not None:
            record.fields.update({"num_sampled": obs.observe_value(num_sampled),
                                  "num_rejected": obs.observe_value(num_rejected),
                                  "sampled_tokens": obs.observe_value(sampled)})
        value = call(idx_mapping, sampled, num_sampled, num_rejected, *args, **kwargs)
        if record is not None:
            # what postprocess wrote back into each row's request state
            record.fields.update(_written_back(self.runner.req_states, idx_mapping))
        return value

    def _probe_lora(self, call: Any, prompt_mapping: Any, token_mapping: Any, lora_requests: Any,
                    *args: Any, **kwargs: Any) -> Any:
        """What execute_model hands the LoRA manager (LoraState.make_lora_inputs), on the
        record of the batch it was built from (the rank-local one under PCP)."""
        record = self._forward_record(self._result)
        if record is not None:
            record.fields.update(_lora_fields(prompt_mapping, token_mapping, lora_requests))
        return call(prompt_mapping, token_mapping, lora_requests, *args, **kwargs)


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
