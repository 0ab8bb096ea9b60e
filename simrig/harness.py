"""The runner harness: applies Steps through the real MRV2 code.

One step, in the order GPUModelRunner.execute_model runs it:

    Step --vllm_api--> SchedulerOutput
      lifecycle   finish_requests / add_requests / update_requests (real)
                  drafter stand-in writes draft token ids into req_states
      gather      gather_batch_req_state                    -> BatchReqState
      dispatch    dispatch_cg_and_sync_dp (vLLM's CudaGraphManager, see
                  adapters/cudagraph.py)                    -> BatchExecutionDescriptor
      prepare     prepare_inputs(..., descriptor)           -> global InputBatch, padded
      partition   PCPManager.partition_batch(batch, descriptor), every PCP rank
                  (and every DCP rank under DCP > 1)        -> rank-local InputBatch
      postprocess sampler stand-in + postprocess_sampled    (advances GPU state)
      dummy       InputBatch.make_dummy for the same descriptor, as cudagraph
                  capture builds it (PCP: prepare_inputs_for_capture_or_profile)
      capture     first step only: make_dummy at every descriptor vLLM captures

An exception stops the step where the real runner would stop (dummy still
runs: cudagraph capture builds it independently). Nothing is raised out of
``run_step``: every exception becomes part of the observation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from simrig import observe as obs
from simrig.adapters import cudagraph
from simrig.adapters.runner import VllmApi, load
from simrig.checks.findings import Finding, rig_error
from simrig.step import RunnerConfig, Step, draft_token, rejected_from, synth_token


class Harness:
    """A model-less runner built from the installed vLLM, fed one Step at a time."""

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
        self.runner = self.api.build_runner(config)
        self.pcp_managers = self.api.build_pcp_managers(config)
        self.dcp_peers = self.api.build_dcp_peer_managers(config)
        self.dispatcher = self.api.build_dispatcher(config)
        self.dummy_buffers = self.api.dummy_buffers(config)
        self.num_steps = 0

    # The hot path: keep it to the real calls and their observations.
    def run_step(self, step: Step) -> obs.StepObs:
        result = obs.StepObs(index=self.num_steps)
        self.num_steps += 1
        so = self.api.scheduler_output(step)
        if not self._lifecycle(step, so, result):
            return self._dummy(step, result)
        if not step.num_scheduled_tokens or obs.GATHER not in self.stages:
            return self._dummy(step, result)
        batch_state = self._timed(result, obs.GATHER, None, step, self._gather, so)
        if batch_state is None:
            return self._dummy(step, result)
        desc = self._timed(result, obs.DISPATCH, None, step, self._dispatch, step, *batch_state,
                           observe=False)
        if desc is None:
            return self._dummy(step, result)
        result.stages[-1].fields = {k: obs.observe_value(v) for k, v in cudagraph.describe(desc).items()}
        if obs.PREPARE in self.stages:
            self._prepare_partition_postprocess(step, so, batch_state[0], desc, result)
        return self._dummy(step, result, desc)

    def _gather(self, so: Any) -> Any:
        """gather_batch_req_state as the runner runs it: under PCP with its PCP
        manager set (prefill rows never run as decodes there). The manager is
        unset again for prepare_inputs, whose global batch the harness then
        partitions for every rank itself."""
        self.runner.pcp_manager = self.pcp_managers[0] if self.pcp_managers else None
        try:
            return self.runner.gather_batch_req_state(so, False)
        finally:
            self.runner.pcp_manager = None

    def _dispatch(self, step: Step, batch_state: Any, uniform_token_count: int | None) -> Any:
        """The descriptor execute_model picks: token count from the batch (the
        largest rank-local one under PCP), no max query length with a prefill."""
        num_tokens = batch_state.num_tokens
        max_query_len = None if batch_state.has_prefill else max(step.num_scheduled_tokens.values())
        if self.pcp_managers:
            num_tokens = self.pcp_managers[0].get_num_tokens_for_dispatch(
                batch_state.num_scheduled_tokens, batch_state.is_prefilling_np)
        return cudagraph.dispatch(self.dispatcher, num_reqs=len(step.num_scheduled_tokens),
                                  num_tokens=num_tokens, uniform_token_count=uniform_token_count,
                                  max_query_len=max_query_len,
                                  decode_query_len=self.config.decode_query_len)

    def _lifecycle(self, step: Step, so: Any, result: obs.StepObs) -> bool:
        runner = self.runner

        def apply() -> dict[str, Any]:
            runner.finish_requests(so)
            runner.add_requests(so)
            runner.update_requests(so)
            self._write_drafts(step)
            held = runner.req_states.req_id_to_index  # the runner's live set and slots (checks/fields.py)
            ids = sorted(held)
            return {"runner.live_ids": ids, "runner.live_slots": [held[r] for r in ids],
                    "runner.free_slots": list(runner.req_states.free_indices),
                    # the PCP world actually driven (1 where the release cannot drive the config)
                    "runner.pcp_size": len(self.pcp_managers) or 1}

        return self._timed(result, obs.LIFECYCLE, None, step, apply) is not None

    def _write_drafts(self, step: Step) -> None:
        """Drafter stand-in: draft j of a request at position n proposes position
        n+1+j; drafts the trace says the sampler rejects propose a wrong token
        (``simrig.step.draft_token``), so acceptance shows in input_ids."""
        if not step.spec_tokens:
            return
        states = self.runner.req_states
        for req_id, k in step.spec_tokens.items():
            idx = states.req_id_to_index.get(req_id)
            if idx is None or k <= 0:
                continue  # an unknown id fails loudly in gather, where the runner looks it up
            # drafts fill the last k positions of the request's query
            first = int(states.num_computed_tokens_np[idx]) + step.num_scheduled_tokens.get(req_id, 0) - k
            first_rejected = rejected_from(step, req_id)
            ids = [draft_token(req_id, first + j, j >= first_rejected) for j in range(k)]
            states.draft_tokens[idx, :k] = self.api.torch.tensor(ids, dtype=states.draft_tokens.dtype)

    def _prepare_partition_postprocess(self, step: Step, so: Any, batch_state: Any, desc: Any,
                                       result: obs.StepObs) -> None:
        runner = self.runner
        batch = self._timed(result, obs.PREPARE, None, step,
                            runner.prepare_inputs, so, batch_state, desc, 0)
        if batch is None:
            return
        if obs.PARTITION in self.stages:
            for rank, manager in enumerate(self.pcp_managers):
                self._timed(result, obs.PARTITION, rank, step,
                            manager.partition_batch, batch, desc, extra=_pcp_private_view)
            for rank, dcp_rank, manager in self.dcp_peers:
                self._timed(result, obs.PARTITION, rank, step, manager.partition_batch, batch, desc,
                            extra=_pcp_private_view)
                result.stages[-1].dcp_rank = dcp_rank
        self._timed(result, obs.POSTPROCESS, None, step, self._sample, step, batch)

    def _sample(self, step: Step, batch: Any) -> dict[str, Any]:
        """Sampler stand-in, then the real postprocess_sampled.

        Row i samples (num_logits_i - rejected_i) tokens; the token sampled
        from a request's logit that ends at sequence position p is
        synth_token(req, p + 1), so every position has one well-defined id.
        """
        torch = self.api.torch
        n = batch.num_reqs
        cu = batch.cu_num_logits_np[: n + 1]
        num_logits = np.diff(cu).astype(np.int32)
        seq_lens = batch.seq_lens[:n].cpu().numpy()
        width = max(int(num_logits.max()), 1)
        sampled = np.zeros((n, width), dtype=np.int64)
        num_sampled = num_logits.copy()
        for i, req_id in enumerate(batch.req_ids):
            first = int(seq_lens[i]) - int(num_logits[i]) + 1
            sampled[i, : num_logits[i]] = [synth_token(req_id, first + j)
                                           for j in range(int(num_logits[i]))]
            num_sampled[i] -= min(step.rejected.get(req_id, 0), int(num_logits[i]) - 1)
        device = self.api.device
        num_sampled_t, num_rejected_t = self.api.get_num_sampled_and_rejected(
            torch.from_numpy(num_sampled).to(device), batch.seq_lens[:n], batch.cu_num_logits,
            batch.idx_mapping, self.runner.req_states.prefill_len.gpu)
        self.runner.postprocess_sampled(
            batch.idx_mapping, torch.from_numpy(sampled).to(device), num_sampled_t,
            num_rejected_t, batch.query_start_loc)
        return {"num_sampled": num_sampled_t, "num_rejected": num_rejected_t}

    def _dummy(self, step: Step, result: obs.StepObs, desc: Any = None) -> obs.StepObs:
        if obs.DUMMY not in self.stages:
            return result
        num_reqs = len(step.num_scheduled_tokens)
        num_tokens = step.total_num_scheduled_tokens
        if desc is not None and cudagraph.mode_name(desc) != "NONE":
            # the batch this descriptor's graph was captured with
            self._timed(result, obs.DUMMY, None, step, self._capture_dummy, desc)
        elif 0 < num_reqs <= num_tokens:
            self._timed(result, obs.DUMMY, None, step, self.api.InputBatch.make_dummy,
                        num_reqs, num_tokens, self.dummy_buffers)
        if result.index == 0:
            for capture in cudagraph.capture_descriptors(self.dispatcher):
                self._timed(result, obs.CAPTURE, None, step, self._capture_dummy, capture)
                result.stages[-1].fields.update(
                    {"desc." + k: obs.observe_value(v) for k, v in cudagraph.describe(capture).items()})
        return result

    def _capture_dummy(self, desc: Any) -> Any:
        """InputBatch.make_dummy with the arguments cudagraph capture derives
        from a descriptor (CudaGraphManager.capture -> prepare_inputs_to_capture),
        then PCP's staging of it."""
        num_tokens = desc.num_tokens
        num_reqs = desc.num_reqs or min(num_tokens, self.config.max_num_reqs)
        max_query_len = desc.max_query_len or desc.uniform_token_count
        if max_query_len is None and cudagraph.mode_name(desc) == "FULL":
            max_query_len = num_tokens
        batch = self.api.InputBatch.make_dummy(num_reqs, num_tokens, self.dummy_buffers,
                                               max_query_len=max_query_len)
        if self.pcp_managers:
            batch = self.api.prepare_for_capture(self.pcp_managers[0], batch)
        return batch

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
            record.error = _error_obs(exc, step)
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


def _pcp_private_view(bound_partition: Any) -> dict[str, obs.FieldObs]:
    """The manager's restore/gather index arrays (global = gathered[restore])."""
    manager = bound_partition.__self__
    out = {}
    for name in ("_hidden_restore_idx", "_padded_gather_idx", "_gathered_kv_write_mask"):
        # None is observed too: the contract decides whether it may be None.
        out["manager." + name.lstrip("_")] = obs.observe_value(getattr(manager, name, None))
    return out


def _error_obs(exc: Exception, step: Step) -> obs.ErrorObs:
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        req_ids: tuple[str, ...] = (exc.args[0],)
    else:
        req_ids = tuple(step.num_scheduled_tokens)
    return obs.ErrorObs(type=type(exc).__name__, message=str(exc)[:500], req_ids=req_ids)
