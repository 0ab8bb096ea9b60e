"""vLLM's own dummy paths, as the harness drives them: ``DummyRuns``.

The profile run and CUDA-graph capture once per runner before the first step (as a worker
starts), and ``GPUModelRunner._dummy_run`` after every step (unless it says ``idle_dummy``
false), all in the runner's own buffers. The probes pass through meanwhile
(``simrig.step_context.StepContext.passing_through``); only the batch each path builds is
observed, as the profile, capture and dummy stages. See docs/layout.md, 'The step path'.
"""

from __future__ import annotations

import time
from typing import Any

from simrig import observe as obs
from simrig.adapters.probes import attn_fields, desc_key, descriptor_fields, error_obs
from simrig.adapters.probes import tap_capture_descriptors
from simrig.step import Step
from simrig.step_context import StepContext
from simrig.vllm_runtime import platform


class DummyRuns:
    """The dummy paths of one runner, observed into ``ctx``:

        startup     profile_run            the profile stage: its batch and descriptor
                                           (or its exception: a worker that cannot
                                           profile does not start)
                    capture_model          one capture stage per captured descriptor
        each step   _dummy_run(num_tokens) the dummy stage (uniform when the step
                                           dispatched as a uniform decode)
    """

    def __init__(self, ctx: StepContext, runner: Any, stages: frozenset[str]):
        self.ctx, self.runner, self.stages = ctx, runner, stages
        self.captured = False  # capture_model ran (once per runner)
        # each captured descriptor's dummy: (descriptor, (fields, declared)), by descriptor key
        self._captures: dict[tuple, tuple[Any, tuple]] = {}
        self._capture_desc: Any = None  # the descriptor being captured now

    def start_up(self, result: obs.StepObs) -> None:
        """GPUModelRunner.profile_run, then capture_model, once, before the first step
        (as the worker starts): vLLM's CudaGraphManager builds each descriptor's dummy in
        the runner's own buffers and records the stand-in forward; each captured dummy
        is observed as a capture stage."""
        self.captured = True
        self._profile(result)
        manager = self.runner.cudagraph_manager
        if not manager.needs_capture():
            return
        manager._graphs_captured = False
        self._captures, self._capture_desc = {}, None
        record = obs.StageObs(stage=obs.CAPTURE)
        start = time.perf_counter()
        try:
            with self.ctx.passing_through("capture"), \
                    tap_capture_descriptors(manager, self._on_capture_desc), \
                    platform.graph_capture_without_cuda():
                self.runner.capture_model()
        except Exception as exc:  # a failed capture is an observation (vLLM would not start)
            record.error = error_obs(exc, self.ctx.step)
        finally:
            platform.unlock_workspace()
        record.duration_s = time.perf_counter() - start
        if record.error is not None:
            result.stages.append(record)
            return
        if obs.DUMMY not in self.stages:
            return
        for desc, fields in self._captures.values():
            stage = obs.StageObs(stage=obs.CAPTURE, fields=dict(fields[0]), declared=fields[1])
            stage.fields.update(descriptor_fields(desc, "desc."))
            stage.duration_s = record.duration_s / max(len(self._captures), 1)
            result.stages.append(stage)

    def _profile(self, result: obs.StepObs) -> None:
        """GPUModelRunner.profile_run (as the worker sizes its KV cache): a dummy run at
        the whole token budget without attention metadata, then the sampler's warm-up.
        Its batch (seen where the forward's model inputs are prepared: it skips
        prepare_attn) and descriptor are the profile stage; an exception is that stage's
        error: a worker that cannot profile does not start."""
        record = obs.StageObs(stage=obs.PROFILE)
        model_state = self.runner.model_state
        model_state.inputs_observer = self._on_profile_inputs
        start = time.perf_counter()
        # the dispatch probe keeps the profile run's descriptor on this record
        try:
            with self.ctx.passing_through("profile", record if obs.DUMMY in self.stages else None), \
                    platform.profile_without_cuda(), platform.streams_without_cuda():
                self.runner.profile_run()
        except Exception as exc:  # vLLM's exceptions are observations
            record.error = error_obs(exc, self.ctx.step)
        finally:
            model_state.inputs_observer = None
            self.runner.execute_model_state = None
        record.duration_s = time.perf_counter() - start
        if record.error is not None or (obs.DUMMY in self.stages and record.fields):
            result.stages.append(record)

    def _on_profile_inputs(self, input_batch: Any) -> None:
        """The profile run's batch, as its forward receives it (the first one:
        the drafter's warm-up reuses the runner's model state)."""
        record = self.ctx.dummy_record
        if self.ctx.mode == "profile" and record is not None and "num_tokens" not in record.fields:
            record.fields.update(obs.observe_fields(input_batch))
            record.declared = obs.declared_fields(input_batch) | {"desc"}

    def _on_capture_desc(self, desc: Any) -> None:
        self._capture_desc = desc

    def on_attn(self, input_batch: Any, _cg_mode: Any = None, block_tables: Any = None,
                slot_mappings: Any = None, *args: Any, **kwargs: Any) -> None:
        """The model-state stand-in's prepare_attn: the batch the forward runs, and the
        block tables and slot mappings a dummy hands the attention metadata builders."""
        ctx = self.ctx
        if ctx.mode == "capture" and self._capture_desc is not None:
            # FULL descriptors are prepared twice (warmup, then capture): the last is kept
            fields = {**obs.observe_fields(input_batch), **attn_fields(block_tables, slot_mappings)}
            self._captures[desc_key(self._capture_desc)] = (
                self._capture_desc, (fields, obs.declared_fields(input_batch) | {"attn"}))
        elif ctx.mode == "dummy" and ctx.dummy_record is not None:
            ctx.dummy_record.fields.update(obs.observe_fields(input_batch))
            ctx.dummy_record.fields.update(attn_fields(block_tables, slot_mappings))
            ctx.dummy_record.declared = obs.declared_fields(input_batch) | {"desc", "attn"}

    def after_step(self, step: Step, result: obs.StepObs, desc: Any) -> None:
        """GPUModelRunner._dummy_run for this step's token count, after the step, in the
        runner's own buffers (what an idle data-parallel rank runs while its peers run
        this batch); uniform when the step dispatched as a uniform decode. Not after a
        step whose ``idle_dummy`` is False."""
        num_tokens = step.total_num_scheduled_tokens
        if obs.DUMMY not in self.stages or num_tokens <= 0 or not step.idle_dummy:
            return
        uniform = desc is not None and desc.uniform_token_count is not None
        record = obs.StageObs(stage=obs.DUMMY)
        result.stages.append(record)
        start = time.perf_counter()
        try:
            with self.ctx.passing_through("dummy", record):
                self.runner._dummy_run(num_tokens, uniform_decode=uniform)
        except Exception as exc:  # vLLM's exceptions are observations
            record.error = error_obs(exc, step)
        finally:
            self.runner.execute_model_state = None
        record.duration_s = time.perf_counter() - start
