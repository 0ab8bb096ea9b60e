"""One row per argument vLLM's call sites hand on (``call_sites.SITES``): judged, or why not.

A judged row names the decisions (``decisions.py``: stage.field) whose checks hold the
value; ``tests/test_call_sites.py`` fails when a named decision is not judged. A row that
is not judged says why, citing the vLLM (or rig) lines that make it so; those citations are
re-read in each release with the others (``evidence.verify``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simrig.ledger.evidence import EXECUTE, Cite

_MR = "v1/worker/gpu/model_runner.py"
_CG = "v1/worker/gpu/cudagraph_utils.py"
_INIT, _LOAD, _KV = "GPUModelRunner.__init__", "GPUModelRunner.load_model", "GPUModelRunner.initialize_kv_cache"


@dataclass(frozen=True)
class CallRow:
    judged_by: tuple[str, ...] = ()  # decisions ("stage.field") whose checks hold the value
    reason: str = ""  # why it is not judged, when judged_by is empty
    evidence: tuple[Cite, ...] = ()

    @property
    def judged(self) -> bool:
        return bool(self.judged_by)


def judged(*decisions: str) -> CallRow:
    return CallRow(judged_by=decisions)


def because(reason: str, *evidence: Cite) -> CallRow:
    return CallRow(reason=reason, evidence=evidence)


def _built(attr: str, where: str = _INIT) -> Cite:
    if attr == "attn_groups":  # a tuple target
        return Cite(_MR, where, "( self.attn_groups, attn_cg_support, self.kernel_block_sizes, ) = init_attn_backend(")
    return Cite(_MR, where, f"self.{attr} =")


# -- the reasons shared by many rows ------------------------------------------------------
def _fixed(attr: str, where: str = _INIT) -> CallRow:
    return because(f"built once with the runner ({where.split('.')[-1]}); the same object on every "
                   "step, not a decision of the step", _built(attr, where))


_SAME_CONFIG = "the config object vLLM builds for the trace (vllm_parts/vllm_config.py), the same every step"
_STANDIN_MODEL = Cite("simrig/adapters/standins.py", "ModelStandIn",
                      "class ModelStandIn:")
_STANDIN_VERIFIER = Cite("simrig/adapters/sampling.py", "GreedyVerifier", "class GreedyVerifier:")
# under speculative decoding only greedy requests verified by vLLM's sampler are spread; the others one-hot
_ONE_HOT_UNDER_DRAFTS = Cite("simrig/sampling/logits.py", "spreads", "spec.temperature == 0.0")
_NO_DP = because("data parallelism is off in every config simrig draws (one DP rank); the idle DP "
                 "rank's own batch is the idle dummy, driven and judged on its own path",
                 Cite(_MR, "GPUModelRunner.dp_size", "return self.parallel_config.data_parallel_size",
                      {"0.30.0": None, "0.31.0": None}),
                 Cite(_MR, _INIT, "self.dp_size = self.parallel_config.data_parallel_size",
                      {"0.32.0": None, "0.33.0": None}))
_NO_EMBEDS = because("text-only models: no multimodal or prompt-embeds inputs, so inputs_embeds stays None",
                     Cite(_MR, EXECUTE, "inputs_embeds = None"))
_NO_PP_INPUT = because("intermediate tensors come from the previous pipeline rank: the last rank is driven as "
                       "the first (None), a non-last rank gets the forward stand-in's zeros, which nothing "
                       "reads (docs/standins.md)", Cite(_MR, EXECUTE, '"intermediate_tensors": None,'))
_NO_PROMPT_LOGPROBS = Cite("simrig/vllm_sampling/sampling_params.py", "sampling_params",
                           "prompt_logprob_token_ids", absent=True)
_COMPILED = because("skip_compiled is set only for encoder-decoder models with encoder inputs, which "
                    "no trace has", Cite(_MR, EXECUTE, "if self.is_encoder_decoder and "
                                                       "scheduler_output.scheduled_encoder_inputs:"))
_STATS = because("cudagraph metrics are off (ObservabilityConfig default): cudagraph_stats stays None",
                 Cite(_MR, EXECUTE, "if self.observability_config.cudagraph_metrics:"))
_NOT_RANDOM = because("False, profile_run's default: random token ids only spread MoE routing, and the "
                      "profile run's ids are not judged (its tokens are: every one real)",
                      Cite(_MR, "GPUModelRunner.profile_run", "def profile_run(self, randomize_inputs: bool = False)",
                           {"0.30.0": None}))
_BATCH = ("prepare.req_ids", "prepare.idx_mapping", "prepare.query_start_loc", "prepare.seq_lens",
          "prepare.logits_indices", "prepare.positions", "prepare.input_ids")
_ATTN = ("prepare.query_start_loc", "prepare.seq_lens", "prepare.seq_lens_cpu_upper_bound",
         "prepare.is_prefilling_np", "prepare.attn.block_tables.0", "prepare.attn.slot_mappings")
_DUMMY_ATTN = ("dummy.query_start_loc", "dummy.seq_lens", "dummy.attn.block_tables.0",
               "dummy.attn.slot_mappings", "capture.attn.block_tables.0", "capture.attn.slot_mappings")
_CAPTURE_ATTN = ("capture.query_start_loc", "capture.seq_lens", "capture.attn.block_tables.0",
                 "capture.attn.slot_mappings", "capture.dcp_local_seq_lens")
_SAMPLED = ("postprocess.num_sampled", "postprocess.num_rejected", "postprocess.output.sampled_token_ids",
            "postprocess.sampled_tokens", "postprocess.sampler.sampled_token")

ROWS: dict[tuple[str, str], CallRow] = {
    # -- the model ---------------------------------------------------------------------
    ("the model's inputs", "input_ids"): judged("prepare.input_ids", "dummy.num_tokens"),
    ("the model's inputs", "positions"): judged("prepare.positions", "dummy.positions"),
    ("the model's inputs", "inputs_embeds"): _NO_EMBEDS,
    ("the model's inputs", "intermediate_tensors"): _NO_PP_INPUT,
    ("the model's inputs", "**self.model_state.prepare_inputs(input_batch, self.req_states)"): because(
        "the model state's extra inputs (M-RoPE positions, multimodal): the stand-in model state "
        "adds none (docs/standins.md)", Cite("simrig/adapters/standins.py", "ModelStateStandIn",
                                             "class ModelStateStandIn:")),
    ("the model", "**model_inputs"): judged("prepare.input_ids", "prepare.positions"),
    ("the PIECEWISE graph", "self.model"): _fixed("model", _LOAD),
    ("the PIECEWISE graph", "model_inputs"): judged("prepare.input_ids", "prepare.positions"),
    ("the FULL graph replay", "batch_desc"): judged("dispatch.cg_mode", "dispatch.num_tokens",
                                                    "dispatch.num_reqs", "dispatch.uniform_token_count"),
    # -- the forward context: what attention layers and MoE read during the forward -----
    ("the forward context", "attn_metadata"): judged(*_ATTN),
    ("the forward context", "self.vllm_config"): because(_SAME_CONFIG, _built("vllm_config")),
    ("the forward context", "num_tokens"): judged("prepare.num_tokens_after_padding",
                                                  "dummy.num_tokens_after_padding"),
    ("the forward context", "cudagraph_runtime_mode"): judged("dispatch.cg_mode"),
    ("the forward context", "num_tokens_across_dp"): _NO_DP,
    ("the forward context", "batch_descriptor"): judged("prepare.num_tokens_after_padding",
                                                        "dispatch.num_active_loras"),
    ("the forward context", "ubatch_slices"): judged("ubatch.slice.tokens", "ubatch.req_ids",
                                                     "ubatch.query_start_loc", "ubatch.seq_lens"),
    ("the forward context", "slot_mapping"): judged("prepare.attn.slot_mappings", "dummy.attn.slot_mappings"),
    ("the forward context", "skip_compiled"): _COMPILED,
    ("the forward context", "is_padding"): judged("prepare.is_padding", "dummy.is_padding",
                                                  "profile.is_padding", "partition.is_padding"),
    ("the batch descriptor", "num_tokens"): judged("prepare.num_tokens_after_padding"),
    ("the batch descriptor", "has_lora"): because(
        "whether the runner has a LoRAConfig at all: fixed with the runner (the trace's max_loras)",
        _built("lora_config")),
    ("the batch descriptor", "num_active_loras"): judged("dispatch.num_active_loras"),
    # -- the graph dispatch --------------------------------------------------------------
    ("the graph dispatch", "self.cudagraph_manager"): _fixed("cudagraph_manager", _KV),
    ("the graph dispatch", "num_reqs"): judged("dispatch.num_reqs", "gather.req_ids"),
    ("the graph dispatch", "num_toks"): judged("gather.num_tokens", "dispatch.num_tokens"),
    ("the graph dispatch", "uniform_tok_count"): judged("dispatch.uniform_token_count"),
    ("the graph dispatch", "self.dp_size"): _NO_DP,
    ("the graph dispatch", "self.dp_rank"): _NO_DP,
    ("the graph dispatch", "max_query_len"): judged("dispatch.max_query_len"),
    ("the graph dispatch", "need_eager"): judged("dispatch.cg_mode", "profile.num_tokens"),
    ("the graph dispatch", "num_active_loras"): judged("dispatch.num_active_loras"),
    ("the graph dispatch", "parallel_config"): because(_SAME_CONFIG, _built("parallel_config")),
    ("the graph dispatch", "allow_ubatching"): judged("ubatch.desc.num_ubatches"),
    ("the graph dispatch", "uniform_decode"): judged("dispatch.uniform_decode", "ubatch.desc.num_ubatches"),
    ("the graph dispatch", "allow_skip_drafts"): because(
        "the scheduler's skip_drafts flag: False in every step simrig sends (SchedulerOutput's "
        "default); drafts are scheduled per request instead",
        Cite(_MR, EXECUTE, "allow_skip_drafts=scheduler_output.skip_drafts,", {
            "0.30.0": None, "0.31.0": None, "0.32.0": None})),
    # -- the batch ---------------------------------------------------------------------
    ("the request-state gather", "scheduler_output"): judged("gather.req_ids", "gather.num_scheduled_tokens",
                                                             "lifecycle.runner.live_ids"),
    ("the request-state gather", "dummy_run"): judged("gather.req_ids", "dummy.num_tokens"),
    ("the input batch", "scheduler_output"): judged("prepare.req_ids", "prepare.num_scheduled_tokens"),
    ("the input batch", "batch_req_state"): judged("gather.req_ids", "gather.idx_mapping_np",
                                                   "gather.num_scheduled_tokens"),
    ("the input batch", "batch_desc"): judged("prepare.num_tokens_after_padding",
                                              "prepare.num_reqs_after_padding"),
    ("the input batch", "num_active_loras"): judged("dispatch.num_active_loras"),
    ("the dummy batch", "dummy_num_reqs"): judged("dummy.num_reqs", "dummy.desc.num_reqs"),
    ("the dummy batch", "batch_desc.num_tokens"): judged("dummy.num_tokens", "dummy.desc.num_tokens"),
    ("the dummy batch", "self.input_buffers"): _fixed("input_buffers"),
    ("the dummy batch", "max_query_len"): judged("dummy.max_query_len", "dummy.desc.max_query_len"),
    ("the dummy batch", "is_padding"): judged("dummy.is_padding", "profile.is_padding"),
    ("the attention builders", "input_batch"): judged(*_ATTN),
    ("the attention builders", "batch_desc.cg_mode"): judged("dispatch.cg_mode"),
    ("the attention builders", "block_tables"): judged("prepare.attn.block_tables.0",
                                                      "dummy.attn.block_tables.0"),
    ("the attention builders", "slot_mappings"): judged("prepare.attn.slot_mappings",
                                                       "dummy.attn.slot_mappings"),
    ("the attention builders", "attn_groups"): _fixed("attn_groups", _KV),
    ("the attention builders", "self.kv_cache_config"): _fixed("kv_cache_config", _KV),
    ("the attention builders", "for_capture"): judged("dispatch.cg_mode", *_DUMMY_ATTN),
    ("the DCP lengths", "input_buffers.dcp_local_seq_lens"): judged("prepare.dcp_local_seq_lens"),
    ("the DCP lengths", "input_batch.seq_lens"): judged("prepare.seq_lens"),
    ("the DCP lengths", "input_batch.num_reqs"): judged("prepare.num_reqs"),
    ("the DCP lengths", "self.dcp_size"): _fixed("dcp_size"),
    ("the DCP lengths", "self.dcp_rank"): _fixed("dcp_rank"),
    ("the DCP lengths", "self.cp_interleave"): _fixed("cp_interleave"),
    ("the DCP lengths", "num_reqs_padded"): judged("prepare.num_reqs_after_padding",
                                                   "prepare.dcp_local_seq_lens"),
    ("the per-layer slot mappings", "slot_mappings"): judged("prepare.attn.slot_mappings",
                                                             "dummy.attn.slot_mappings"),
    ("the per-layer slot mappings", "self.kv_cache_config"): _fixed("kv_cache_config", _KV),
    # -- LoRA ----------------------------------------------------------------------------
    ("the LoRA inputs", "input_batch.req_ids"): judged("prepare.req_ids"),
    ("the LoRA inputs", "input_batch.idx_mapping_np"): judged("prepare.idx_mapping_np"),
    ("the LoRA inputs", "input_batch.num_scheduled_tokens"): judged("prepare.num_scheduled_tokens"),
    ("_set_active_loras", "*lora_inputs"): judged("prepare.lora.prompt_mapping", "prepare.lora.token_mapping",
                                                  "prepare.lora.active_ids", "partition.lora.token_mapping"),
    # -- sampling ------------------------------------------------------------------------
    ("sample", "hidden_states"): because(
        "the stand-in model's output (docs/standins.md): hidden states whose values nothing reads (the "
        "logits name the trace's tokens); the rows sample takes are prepare.logits_indices", _STANDIN_MODEL),
    ("sample", "input_batch"): judged(*_BATCH, "prepare.cu_num_logits", "prepare.expanded_idx_mapping"),
    # the step's grammar as vLLM's GrammarOutput (vllm_sampling/bitmask.py); its mask is a stage of
    # the reference row, and each grammar request's row is -inf outside its own allowed set
    ("sample", "grammar_output"): judged("postprocess.sampler.grammar_mask", "postprocess.sampler.grammar_token",
                                         "postprocess.sampler.processed_logits"),
    ("the logits", "sample_hidden_states"): judged("prepare.logits_indices"),
    # a row of a request with parameters is spread; the oracle's reference starts from the same row
    ("the sampler", "logits"): judged("prepare.logits_indices", "prepare.cu_num_logits",
                                      "postprocess.sampler.processed_logits", "postprocess.output.sampled_token_ids"),
    ("the sampler", "input_batch"): judged("prepare.logits_indices", "prepare.idx_mapping", "prepare.cu_num_logits",
                                           "postprocess.sampler.processed_logits"),
    # one-hot rows (drafts): a draft is kept iff it is its row's token, as spec_outcomes expects
    ("the rejection sampler", "logits"): judged("prepare.logits_indices", "prepare.cu_num_logits",
                                                "postprocess.sampled_tokens"),
    ("the rejection sampler", "input_batch"): judged("prepare.logits_indices", "prepare.cu_num_logits",
                                                     "prepare.expanded_idx_mapping",
                                                     "prepare.num_draft_tokens_per_req"),
    ("the rejection sampler", "self.speculator.draft_logits"): because(
        "the drafter is a stand-in (docs/standins.md) without draft probabilities: None, never read by "
        "the default verifier (a greedy stand-in) and handed as None to vLLM's RejectionSampler (config "
        "rejection_sampler); sampling parameters change nothing here, since under speculative decoding "
        "only greedy requests' rows are spread, and greedy verification reads no draft probabilities",
        Cite("simrig/adapters/sampling.py", "DrafterStandIn", "draft_logits = None"), _STANDIN_VERIFIER,
        _ONE_HOT_UNDER_DRAFTS),
    # a P/D step's placeholder drafts of a grammar request (none acceptable): those rows rejected
    ("the rejection sampler", "invalid_drafts"): judged("postprocess.num_sampled",
                                                        "postprocess.output.sampled_token_ids"),
    # -- what the sampled tokens write back, and what the scheduler receives ---------------
    ("the state write-back", "input_batch.idx_mapping"): judged("prepare.idx_mapping"),
    ("the state write-back", "sampler_output.sampled_token_ids"): judged(*_SAMPLED),
    ("the state write-back", "num_sampled"): judged("postprocess.num_sampled"),
    ("the state write-back", "num_rejected"): judged("postprocess.num_rejected"),
    ("the state write-back", "input_batch.query_start_loc"): judged("prepare.query_start_loc"),
    ("post_update", "idx_mapping"): judged("prepare.idx_mapping"),
    ("post_update", "self.req_states.num_computed_tokens.gpu"): judged(
        "postprocess.post.num_computed_tokens", "prepare.num_computed_tokens_np"),
    ("post_update", "self.req_states.last_sampled_tokens"): judged("postprocess.post.last_sampled_tokens",
                                                                    "prepare.input_ids"),
    # the counts frequency, presence and repetition penalties read: the reference counts the outputs
    ("post_update", "output_bin_counts"): judged("postprocess.sampler.processed_logits"),
    ("post_update", "sampled_tokens"): judged(*_SAMPLED),
    ("post_update", "num_sampled"): judged("postprocess.num_sampled"),
    ("post_update", "num_rejected"): judged("postprocess.num_rejected"),
    ("post_update", "query_start_loc"): judged("prepare.query_start_loc"),
    ("post_update", "self.req_states.all_token_ids.gpu"): judged("prepare.input_ids",
                                                                 "postprocess.req_states.all_token_ids"),
    ("post_update", "self.req_states.total_len.gpu"): judged("prepare.seq_lens", "prepare.positions",
                                                             "postprocess.req_states.all_token_ids"),
    ("post_update", "draft_tokens"): judged("prepare.input_ids", "prepare.num_draft_tokens_per_req"),
    ("post_update", "self.req_states.draft_tokens"): judged("prepare.input_ids"),
    ("the scheduler's output", "req_ids"): judged("postprocess.output.req_ids"),
    ("the scheduler's output", "req_id_to_index"): because(
        "kept for the older runner's scheduler only; vLLM's own comment: unused in this runner",
        Cite(_MR, "GPUModelRunner.sample_tokens", "# NOTE(woosuk): req_id_to_index is unused in this model "
                                                  "runner.")),
    ("the scheduler's output", "sampled_token_ids"): judged("postprocess.output.sampled_token_ids"),
    # rows of every prompt position: the stand-in model's hidden states name their tokens
    ("the scheduler's output", "prompt_logprobs_dict"): judged("postprocess.output.prompt_logprobs"),
    ("the scheduler's output", "prompt_token_id_logprobs_dict"): because(
        "not driven: simrig sets no prompt_logprob_token_ids on a request (a trace has no such field), "
        "so no request's prompt-token scores are computed and the dict is empty", _NO_PROMPT_LOGPROBS,
        Cite(_MR, "GPUModelRunner.sample_tokens", "self.prompt_logprobs_worker.compute_prompt_token_id_logprobs(",
             {"0.30.0": None})),
    ("the scheduler's output", "cudagraph_stats"): _STATS,
    ("the async output", "model_runner_output"): judged("postprocess.output.req_ids"),
    ("the async output", "sampler_output"): judged(*_SAMPLED, "postprocess.output.logprobs"),
    ("the async output", "num_sampled_tokens"): judged("postprocess.output.num_sampled_tokens"),
    ("the async output", "main_stream"): because("the device's stream: no per-step value",
                                                 Cite(_MR, "GPUModelRunner.main_stream",
                                                      "def main_stream(self)")),
    ("the async output", "copy_stream"): _fixed("output_copy_stream"),
    ("the async output", "check_ep_fault"): _fixed("check_ep_fault"),
    ("the async output", "pending_aux_output"): because(
        "no aux-output connector is configured, so there is none to hand on",
        Cite(_MR, "GPUModelRunner.sample_tokens", "pending_aux_output = None", {"0.30.0": None})),
    ("the async output", "routed_experts"): because(
        "expert routing capture is off (no MoE model): nothing to hand on",
        Cite(_MR, "GPUModelRunner.sample_tokens", "routed_experts=routed_experts,",
             {"0.31.0": None, "0.32.0": None, "0.33.0": None})),
    # -- pipeline ranks --------------------------------------------------------------------
    ("the PP broadcast", "sampler_output.sampled_token_ids"): judged(*_SAMPLED, "pipeline.received",
                                                                      "pipeline.batch.input_ids"),
    ("the PP broadcast", "num_sampled"): judged("postprocess.num_sampled", "pipeline.received"),
    ("the PP broadcast", "num_rejected"): judged("postprocess.num_rejected", "pipeline.last.num_computed_tokens"),
    ("the PP broadcast", "input_batch"): judged(*_BATCH, "pipeline.need_sampled_mask", "pipeline.broadcasts.sent"),
    ("the PP receive", "input_batch"): judged("pipeline.batch.req_ids", "pipeline.need_sampled_mask",
                                              "pipeline.broadcasts.unreceived"),
    ("the PP receive", "recv_drafts"): judged("pipeline.last.draft_tokens", "pipeline.received"),
    # -- the dummy paths -----------------------------------------------------------------------
    ("the dummy step", "dummy_scheduler_output"): judged("dummy.num_tokens", "dummy.num_reqs"),
    ("the dummy step", "intermediate_tensors"): _NO_PP_INPUT,
    ("the dummy step", "dummy_run"): judged("dummy.num_tokens", "dummy.is_padding"),
    ("the dummy step", "skip_attn_for_dummy_run"): judged("dummy.attn.slot_mappings", "profile.num_tokens"),
    ("the dummy step", "is_profile"): judged("profile.is_padding", "dummy.is_padding"),
    ("the dummy step", "context_len"): judged("dummy.attn.block_tables.0", "dummy.seq_lens"),
    ("the dummy step", "valid_dummy_state_slots"): because(
        "distinct Mamba state slots for a profile run with Mamba layers: no model simrig drives "
        "has Mamba layers", Cite(_MR, EXECUTE, "if dummy_run and is_profile and not valid_dummy_state_slots:",
                                 {"0.30.0": None, "0.31.0": None})),
    ("the dummy step", "randomize_inputs"): _NOT_RANDOM,
    ("the profile run", "self.max_num_tokens"): judged("profile.num_tokens"),
    ("the profile run", "skip_attn"): judged("profile.num_tokens"),
    ("the profile run", "is_profile"): judged("profile.is_padding"),
    ("the profile run", "randomize_inputs"): _NOT_RANDOM,
    ("the capture warm-up", "**batch"): because(
        "adaptive verification's timing batches, only with adaptive verification configured",
        Cite(_MR, "GPUModelRunner.capture_model", "self._dummy_run(**batch)")),
    ("capture", "self.model"): _fixed("model", _LOAD),
    ("capture", "self.model_state"): _fixed("model_state", _LOAD),
    ("capture", "input_buffers"): judged("capture.num_tokens", "capture.positions"),
    ("capture", "self.intermediate_tensors"): _NO_PP_INPUT,
    ("capture", "self.block_tables"): judged("capture.attn.block_tables.0"),
    ("capture", "self.attn_groups"): _fixed("attn_groups", _KV),
    ("capture", "self.kv_cache_config"): _fixed("kv_cache_config", _KV),
    ("capture", "pcp_manager"): judged("capture.num_tokens", "capture.is_padding"),
    ("capture", "has_lora"): because("whether the runner has a LoRAConfig at all: fixed with the runner",
                                     _built("lora_config")),
    ("capture", "use_aux_hidden_state_outputs"): _fixed("use_aux_hidden_state_outputs"),
    ("capture", "lora_capture_hook"): judged("capture.desc.num_active_loras"),
    ("the captured model's inputs", "input_ids"): judged("capture.num_tokens"),
    ("the captured model's inputs", "positions"): judged("capture.positions"),
    ("the captured model's inputs", "intermediate_tensors"): _NO_PP_INPUT,
    ("the captured model's inputs", "**model_state.prepare_dummy_inputs(num_reqs, num_tokens)"): because(
        "the model state's extra dummy inputs: the stand-in model state adds none",
        Cite("simrig/adapters/standins.py", "ModelStateStandIn", "class ModelStateStandIn:")),
    ("the captured model", "**model_inputs"): judged("capture.num_tokens", "capture.positions"),
    ("the capture LoRA hook", "desc.num_active_loras"): judged("capture.desc.num_active_loras"),
    ("the capture LoRA hook", "num_reqs"): judged("capture.desc.num_reqs", "capture.num_reqs"),
    ("the capture LoRA hook", "num_tokens"): judged("capture.desc.num_tokens", "capture.num_tokens"),
    ("the capture batch", "num_reqs"): judged("capture.num_reqs", "capture.desc.num_reqs"),
    ("the capture batch", "num_tokens"): judged("capture.num_tokens", "capture.desc.num_tokens"),
    ("the capture batch", "model_state"): _fixed("model_state", _LOAD),
    ("the capture batch", "input_buffers"): judged("capture.num_tokens", "capture.positions"),
    ("the capture batch", "block_tables"): judged("capture.attn.block_tables.0"),
    ("the capture batch", "attn_groups"): _fixed("attn_groups", _KV),
    ("the capture batch", "kv_cache_config"): _fixed("kv_cache_config", _KV),
    ("the capture batch", "full_cudagraph"): judged(*_CAPTURE_ATTN),
    ("the capture batch", "max_query_len"): judged("capture.max_query_len", "capture.desc.max_query_len"),
    ("the capture batch", "pcp_manager"): judged("capture.num_tokens", "capture.is_padding"),
    ("the capture forward context", "attn_metadata"): judged(*_CAPTURE_ATTN),
    ("the capture forward context", "self.vllm_config"): because(_SAME_CONFIG, _built("vllm_config")),
    ("the capture forward context", "num_tokens"): judged("capture.num_tokens", "capture.desc.num_tokens"),
    ("the capture forward context", "cudagraph_runtime_mode"): judged("capture.desc.num_tokens"),
    ("the capture forward context", "num_tokens_across_dp"): _NO_DP,
    ("the capture forward context", "slot_mapping"): judged("capture.attn.slot_mappings"),
    ("the capture forward context", "batch_descriptor"): judged("capture.desc.num_tokens",
                                                                "capture.desc.num_active_loras"),
    ("the capture forward context", "is_padding"): judged("capture.is_padding"),
    ("the capture batch descriptor", "num_tokens"): judged("capture.desc.num_tokens"),
    ("the capture batch descriptor", "has_lora"): because(
        "whether the runner has a LoRAConfig at all: fixed with the runner", _built("lora_config")),
    ("the capture batch descriptor", "num_active_loras"): judged("capture.desc.num_active_loras"),
    ("the capture dummy batch", "num_reqs"): judged("capture.num_reqs"),
    ("the capture dummy batch", "num_tokens"): judged("capture.num_tokens"),
    ("the capture dummy batch", "input_buffers"): judged("capture.positions", "capture.query_start_loc"),
    ("the capture dummy batch", "max_query_len"): judged("capture.max_query_len"),
    ("the capture attention builders", "input_batch"): judged(*_CAPTURE_ATTN),
    ("the capture attention builders", "CUDAGraphMode.NONE"): because(
        "capture builds its metadata in NONE mode on purpose, FULL graphs flagged by for_capture "
        "instead (vLLM's comment)", Cite(_CG, "prepare_inputs_to_capture",
                                         "# In summary: We always generate attention metadata for both FULL and "
                                         "PIECEWISE")),
    ("the capture attention builders", "input_block_tables"): judged("capture.attn.block_tables.0"),
    ("the capture attention builders", "slot_mappings"): judged("capture.attn.slot_mappings"),
    ("the capture attention builders", "attn_groups"): _fixed("attn_groups", _KV),
    ("the capture attention builders", "kv_cache_config"): _fixed("kv_cache_config", _KV),
    ("the capture attention builders", "for_capture"): judged(*_CAPTURE_ATTN),
    ("the capture DCP lengths", "input_buffers.dcp_local_seq_lens"): judged("capture.dcp_local_seq_lens"),
    ("the capture DCP lengths", "input_batch.seq_lens"): judged("capture.seq_lens"),
    ("the capture DCP lengths", "input_batch.num_reqs"): judged("capture.num_reqs"),
    ("the capture DCP lengths", "block_tables.cp_size"): _fixed("dcp_size"),
    ("the capture DCP lengths", "block_tables.cp_rank"): _fixed("dcp_rank"),
    ("the capture DCP lengths", "block_tables.cp_interleave"): _fixed("cp_interleave"),
    ("the capture DCP lengths", "num_reqs_padded"): judged("capture.num_reqs_after_padding",
                                                           "capture.dcp_local_seq_lens"),
    ("the capture DCP context", "input_batch"): judged("capture.dcp_local_seq_lens", "capture.seq_lens"),
    ("the capture DCP context", "model_state"): _fixed("model_state", _LOAD),
    ("the capture DCP context", "block_tables"): judged("capture.attn.block_tables.0"),
    ("the capture DCP context", "input_block_tables"): judged("capture.attn.block_tables.0"),
    ("the capture DCP context", "kv_cache_config"): _fixed("kv_cache_config", _KV),
}


def cites() -> list[Cite]:
    """Every citation the rows rest on (re-read in each release by ``evidence.verify``)."""
    return [c for row in ROWS.values() for c in row.evidence]

