"""What simrig drives in vLLM, and the errors it raises when the installed
release cannot be driven.

``ENTRY_POINTS`` lists every vLLM function and class the adapter calls, with
the parameters it passes; ``simrig doctor`` checks each against the installed
release, and ``simrig.vllm_api.versions`` adds the parameters that changed
between releases. Every drift is one ``VllmApiError`` naming module,
attribute and version. This module imports nothing from vLLM or from the rest
of the adapter, so both the runner adapter and the version table can use it.
"""

from __future__ import annotations

from dataclasses import dataclass


class VllmApiError(RuntimeError):
    """The installed vLLM lacks (or changed) something simrig drives."""

    def __init__(self, module: str, attribute: str, version: str, problem: str):
        self.module, self.attribute, self.version = module, attribute, version
        super().__init__(f"vLLM {version}: {module}.{attribute}: {problem}")


class VllmUnavailable(RuntimeError):
    """vLLM cannot be imported at all."""


@dataclass(frozen=True)
class EntryPoint:
    module: str
    attribute: str  # "Class.method" or "name"
    params: tuple[str, ...] = ()  # parameters simrig passes (must all exist)


ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.gather_batch_req_state",
               ("scheduler_output", "dummy_run")),
    EntryPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.prepare_inputs",
               ("scheduler_output", "batch_req_state", "batch_desc")),  # + num_active_loras: versions.py
    EntryPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.add_requests",
               ("scheduler_output",)),
    EntryPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.update_requests",
               ("scheduler_output",)),
    EntryPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.finish_requests",
               ("scheduler_output",)),
    EntryPoint("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.postprocess_sampled",
               ("idx_mapping", "sampled_tokens", "num_sampled", "num_rejected",
                "query_start_loc")),
    EntryPoint("vllm.v1.worker.gpu.model_runner", "sort_batch_req_ids",
               ("num_tokens_per_req", "draft_tokens", "decode_query_len")),
    EntryPoint("vllm.v1.worker.gpu.input_batch", "InputBatch.make_dummy",
               ("num_reqs", "num_tokens", "input_buffers", "max_query_len")),
    EntryPoint("vllm.v1.worker.gpu.input_batch", "InputBuffers",
               ("max_num_reqs", "max_num_tokens", "device")),
    EntryPoint("vllm.v1.worker.gpu.input_batch", "get_num_sampled_and_rejected",
               ("num_sampled", "seq_lens", "cu_num_logits", "idx_mapping", "prefill_len")),
    EntryPoint("vllm.v1.worker.gpu.states", "RequestState",
               ("max_num_reqs", "max_model_len", "max_num_batched_tokens",
                "num_speculative_steps", "vocab_size", "device")),
    EntryPoint("vllm.v1.worker.gpu.pcp_manager", "PCPManager",
               ("pcp_world_size", "pcp_rank", "device",  # + shard_decode_requests: versions.py
                "max_num_reqs", "max_num_tokens", "dcp_world_size", "dcp_rank")),
    EntryPoint("vllm.v1.worker.gpu.pcp_manager", "PCPManager.partition_batch",
               ("input_batch",)),  # + batch_desc or padded sizes: versions.py
    EntryPoint("vllm.v1.worker.gpu.cudagraph_utils", "BatchExecutionDescriptor",
               ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len")),
    EntryPoint("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager._init_candidates"),
    EntryPoint("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager._build_lora_dispatch_map"),
    EntryPoint("vllm.v1.worker.gpu.dp_utils", "dispatch_cg_and_sync_dp",
               ("cudagraph_manager", "num_reqs", "num_tokens", "uniform_token_count", "dp_size",
                "dp_rank", "max_query_len", "need_eager", "num_active_loras", "allow_ubatching",
                "uniform_decode")),
    EntryPoint("vllm.v1.worker.gpu.pcp_manager", "PCPManager.get_num_tokens_for_dispatch",
               ("num_scheduled_tokens", "is_prefilling")),
    EntryPoint("vllm.v1.core.sched.output", "SchedulerOutput",
               ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                "total_num_scheduled_tokens", "scheduled_spec_decode_tokens",
                "finished_req_ids", "preempted_req_ids")),
    EntryPoint("vllm.v1.core.sched.output", "NewRequestData",
               ("req_id", "prompt_token_ids", "sampling_params", "block_ids",
                "num_computed_tokens", "prefill_token_ids")),
    EntryPoint("vllm.v1.core.sched.output", "CachedRequestData",
               ("req_ids", "resumed_req_ids", "new_block_ids", "num_computed_tokens")),
)
