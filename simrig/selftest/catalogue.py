"""The catalogue of seeded regressions ``simrig selftest`` must catch.

Each edit is written against the installed source (dedented: a method body
is indented 4 spaces) and must match exactly
once; if vLLM changes the line, the mutant reports that it no longer
applies (it is then re-targeted, not silently dropped).
"""

from __future__ import annotations

from simrig.selftest.catalogue_sampling import SAMPLING
from simrig.vllm_runtime.mutate import Mutant

_MR = "vllm.v1.worker.gpu.model_runner"
_IB = "vllm.v1.worker.gpu.input_batch"
_PCP = "vllm.v1.worker.gpu.pcp_manager"
_ST = "vllm.v1.worker.gpu.states"
_CG = "vllm.v1.worker.gpu.cudagraph_utils"
_BT = "vllm.v1.worker.gpu.block_table"
_AO = "vllm.v1.worker.gpu.async_utils"
_UB = "vllm.v1.worker.gpu.ubatch_utils"

CATALOGUE: tuple[Mutant, ...] = (
    Mutant("idx-mapping-host-int32", _MR, "GPUModelRunner.gather_batch_req_state",
           "idx_mapping_np = np.fromiter(idx_mapping_iter, dtype=np.intp, count=num_reqs)",
           "idx_mapping_np = np.fromiter(idx_mapping_iter, dtype=np.int32, count=num_reqs)",
           "the host batch->slot mapping reverts to int32, so every fancy index converts it again"),
    Mutant("idx-mapping-device-int32", _MR, "GPUModelRunner.prepare_inputs",
           "idx_mapping_np, device=self.device, dtype=torch.int64",
           "idx_mapping_np, device=self.device, dtype=torch.int32",
           "the device batch->slot mapping reverts to int32 (index_select/gather convert on every use)"),
    Mutant("getitem-to-get", _MR, "GPUModelRunner.gather_batch_req_state",
           "map(self.req_states.req_id_to_index.__getitem__, req_ids)",
           "map(self.req_states.req_id_to_index.get, req_ids)",
           "batch mapping built with dict.get: an unknown request id no longer raises KeyError"),
    Mutant("dummy-idx-mapping-np-int32", _IB, "InputBatch.make_dummy",
           "idx_mapping_np = np.arange(num_reqs, dtype=np.intp)",
           "idx_mapping_np = np.arange(num_reqs, dtype=np.int32)",
           "the cudagraph dummy batch's host index array drifts to int32 from the real batch's intp"),
    Mutant("dummy-idx-mapping-int32", _IB, "InputBatch.make_dummy",
           "idx_mapping = torch.arange(num_reqs, dtype=torch.int64, device=device)",
           "idx_mapping = torch.arange(num_reqs, dtype=torch.int32, device=device)",
           "the dummy batch's device index array is int32: graphs captured with the wrong dtype"),
    Mutant("pcp-local-to-global-int32", _PCP, "PCPManager.partition_batch",
           "local_req_ids = [",
           "local_to_global_req_idx_np = local_to_global_req_idx_np.astype(np.int32)\n"
           "    local_req_ids = [",
           "the PCP rank-local -> global slot index reverts to int32"),
    Mutant("sort-key-prefill-first", _MR, "sort_batch_req_ids",
           "(num := num_tokens_per_req[r]) != decode_query_len",
           "(num := num_tokens_per_req[r]) == decode_query_len",
           "batch order puts prefills before decodes; split_decodes_and_prefills misreads the batch"),
    Mutant("query-start-loc-off-by-one", _MR, "GPUModelRunner.prepare_inputs",
           "query_start_loc_np[0] = 0\n",
           "query_start_loc_np[0] = 1\n",
           "off-by-one at the head of the query_start_loc cumulative sum"),
    Mutant("pcp-wrong-chunk", _PCP, "PCPManager._iter_rank_chunks",
           "chunk_indices = (rank, num_chunks - 1 - rank)",
           "chunk_indices = (rank, num_chunks - 2 - rank)",
           "DualChunkSwap gives a rank the wrong mirror chunk: one chunk twice, one never"),
    Mutant("pcp-prefill-rows-first", _PCP, "PCPManager._reorder_segments",
           "bool(is_prefilling[req_idx]),",
           "not bool(is_prefilling[req_idx]),",
           "a PCP rank lists its prefill chunks before its decodes (documented: \"decodes-first, "
           "then prefills\"), so split_decodes_and_prefills misreads every mixed rank-local batch"),
    Mutant("pcp-sharded-decodes-one-owner", _PCP, "PCPManager._iter_rank_chunks",
           "owner_rank = decode_ordinal % self.pcp_world_size",
           "owner_rank = 0 * decode_ordinal",
           "with shard_decode_requests every decode is owned by PCP rank 0 instead of one rank in "
           "turn: each decode still runs once, but the ranks are no longer balanced"),
    Mutant("finish-forgets-free-slot", _ST, "RequestState.remove_request",
           "self.free_indices.append(req_idx)",
           "pass",
           "a finished request's slot never returns to the free list (slot leak)"),
    Mutant("finish-keeps-state", _MR, "GPUModelRunner.finish_requests",
           "for req_id in sorted(finished_req_ids):\n        self._remove_request(req_id)",
           "for req_id in sorted(finished_req_ids):\n        pass",
           "finished and preempted requests are left in the runner's state"),
    Mutant("update-drops-num-computed", _MR, "GPUModelRunner.update_requests",
           "num_computed_tokens_np[req_index] = num_computed_tokens",
           "pass",
           "the scheduler's num_computed_tokens for cached requests is dropped on the host"),
    Mutant("is-prefilling-inclusive", _MR, "GPUModelRunner.gather_batch_req_state",
           "is_prefilling_np = num_computed_prefill_tokens_np < prefill_len_np",
           "is_prefilling_np = num_computed_prefill_tokens_np <= prefill_len_np",
           "a request whose prefill is done is still classed as prefilling"),
    Mutant("add-ignores-prefix-cache", _ST, "RequestState.add_request",
           "self.num_computed_tokens.stage_write_elem(req_idx, num_computed_tokens)",
           "self.num_computed_tokens.stage_write_elem(req_idx, 0)",
           "a new request's prefix-cache hit is forgotten on the device (positions restart at 0)"),
    Mutant("cu-num-logits-int64", _MR, "GPUModelRunner.prepare_inputs",
           "cu_num_logits_np = np.arange(num_reqs + 1, dtype=np.int32)",
           "cu_num_logits_np = np.arange(num_reqs + 1, dtype=np.int64)",
           "cu_num_logits on the host drifts to int64 from the int32 the kernels and dummy use"),
    Mutant("gather-drops-single-draft-counts", _MR, "GPUModelRunner.gather_batch_req_state",
           "if draft_tokens:\n",
           "if draft_tokens and num_reqs > 1:\n",
           "a lone spec-decode request loses its per-request draft counts (None where the drafts "
           "are scheduled): a None-vs-array bug the contract used to skip"),
    Mutant("decode-graph-eligible-and-typo", _MR, "GPUModelRunner.gather_batch_req_state",
           "(prefill_runs_as_decode_np | ~is_prefilling_np).all()",
           "(prefill_runs_as_decode_np & ~is_prefilling_np).all()",
           "| typed as &: a batch whose only prefill rows run as decodes is refused the decode "
           "cudagraph (the eligibility flag contradicts its own definition)"),
    # -- cudagraph dispatch and padding (reached only with a graph mode) --
    Mutant("pad-query-start-loc-zero", _MR, "GPUModelRunner.prepare_inputs",
           "query_start_loc_np[num_reqs + 1 :] = num_tokens",
           "query_start_loc_np[num_reqs + 1 :] = 0",
           "padded requests of a FULL graph get query_start_loc 0 instead of num_tokens: the "
           "offsets stop being non-decreasing (FA3 reads garbage for the padded rows)"),
    Mutant("pad-seq-lens-not-zeroed", _IB, "prepare_pos_seq_lens",
           "_prepare_pos_seq_lens_kernel[(num_reqs + 1,)](",
           "_prepare_pos_seq_lens_kernel[(num_reqs,)](",
           "the kernel's extra block that zeroes the padded seq_lens is dropped: a FULL graph "
           "replays padded requests with the stale lengths of an earlier batch"),
    Mutant("dispatch-ignores-uniform-count", _CG, "_is_compatible",
           "or desc.uniform_token_count == uniform_token_count",
           "or uniform_token_count is not None",
           "a uniform-decode graph serves any uniform batch whatever its per-request count "
           "(a batch of 1-token decodes replays the 1+k-token spec-decode graph)"),
    Mutant("dispatch-range-off-by-one", _CG, "CudaGraphManager._init_candidates",
           "for i in range(current_range_start, num_tokens + 1):",
           "for i in range(current_range_start, num_tokens):",
           "off by one in the candidate ranges: a batch of exactly a capture size finds no graph "
           "and runs eager"),
    Mutant("pcp-capture-seq-lens-unstaged", _PCP, "PCPManager.prepare_inputs_for_capture_or_profile",
           "seq_lens=input_buffers.seq_lens[:num_reqs].copy_(input_batch.seq_lens),",
           "seq_lens=input_buffers.seq_lens[:num_reqs],",
           "PCP's capture staging forgets to copy the dummy's seq_lens into its persistent "
           "buffers: graphs are captured on whatever lengths the last partition left there"),
    # -- DCP ranks and resumed requests --
    Mutant("dcp-upper-bound-own-shard", _PCP, "PCPManager.partition_batch",
           "self.dcp_world_size,\n            0,\n",
           "self.dcp_world_size,\n            self.dcp_rank,\n",
           "the DCP KV upper bound uses this DCP rank's own shard instead of the largest one, "
           "so DCP ranks pad their KV gathers differently"),
    Mutant("resume-drops-output-tokens", _MR, "GPUModelRunner.add_requests",
           "all_token_ids=new_req_data.prefill_token_ids,",
           "all_token_ids=new_req_data.prompt_token_ids,",
           "a resumed request is re-added with its prompt only: the output tokens the scheduler "
           "re-sent (prefill_token_ids) are lost and its prefill length shrinks"),
    # -- issue 19: fields with a new value expectation, and a known finding's precise signature --
    Mutant("dummy-positions-batch-wide", _IB, "InputBatch.make_dummy",
           "positions = input_buffers.positions[:num_tokens].zero_()",
           "positions = input_buffers.positions[:num_tokens].copy_(\n"
           "        torch.arange(num_tokens, device=device))",
           "the dummy batch's positions count across the whole batch instead of restarting per "
           "row: wrong in a different way from the documented zero fill, so it must be new"),
    Mutant("runs-as-decode-fresh-prompt", _MR, "GPUModelRunner.gather_batch_req_state",
           "(num_computed_prefill_tokens_np > 0)",
           "(num_computed_prefill_tokens_np >= 0)",
           "a fresh one-token prompt (no context yet) is classed as running as a decode, so the "
           "batch is wrongly decode-graph eligible"),
    Mutant("draft-counts-capped", _MR, "GPUModelRunner.prepare_inputs",
           "num_draft_tokens_per_req=num_draft_tokens_per_req,",
           "num_draft_tokens_per_req=None if num_draft_tokens_per_req is None\n"
           "        else np.minimum(num_draft_tokens_per_req, 1),",
           "the batch reports per-request draft counts capped at 1 while the logits rows hold all "
           "drafts (a stale per-request count)"),
    Mutant("expanded-local-pos-one-based", _MR, "GPUModelRunner.prepare_inputs",
           "expanded_local_pos = torch.zeros(",
           "expanded_local_pos = torch.ones(",
           "without drafts, each logit's position within its request starts at 1 instead of 0"),
    Mutant("pcp-local-num-tokens-padded", _PCP, "PCPManager.partition_batch",
           "num_tokens=num_local_tokens,",
           "num_tokens=num_local_tokens_padded,",
           "a rank-local batch reports its padded token count as its real one"),
    Mutant("slot-freed-twice", _ST, "RequestState.remove_request",
           "self.free_indices.append(req_idx)",
           "self.free_indices.extend((req_idx, req_idx))",
           "a finished request's slot goes back to the free list twice, so two later requests can "
           "be handed the same slot"),
    Mutant("decode-loses-uniform-count", _MR, "GPUModelRunner.gather_batch_req_state",
           "return batch_state, get_uniform_decode_token_count(",
           "return batch_state, None and get_uniform_decode_token_count(",
           "the uniform decode token count regresses to None: under FULL_AND_PIECEWISE uniform "
           "decode batches run PIECEWISE instead of their FULL decode graph"),
    Mutant("slot-order-fifo", _ST, "RequestState.add_request",
           "req_idx = self.free_indices.pop()",
           "req_idx = self.free_indices.pop(0)",
           "slots handed out FIFO instead of LIFO: different slot numbers, same semantics",
           equivalent=True),
    Mutant("control-noop", _ST, "RequestState.remove_request",
           "self.free_indices.append(req_idx)",
           "self.free_indices.append(req_idx)  # control mutant: the same statement",
           "control: a source edit that changes nothing; it must survive, or the scoring is broken",
           control=True),
    # execute_model's own wiring: simrig calls execute_model, so a change to the
    # arguments it computes for dispatch reaches the oracle.
    Mutant("execute-model-prefill-keeps-max-query-len", _MR, "GPUModelRunner.execute_model",
           "max_query_len = None",
           "max_query_len = max_query_len",
           "execute_model keeps the longest query as the dispatch bound for a batch with a "
           "prefill: a short prefill replays a varlen FULL decode graph"),
    Mutant("execute-model-pcp-dispatches-global-tokens", _MR, "GPUModelRunner.execute_model",
           "num_toks = self.pcp_manager.get_num_tokens_for_dispatch(",
           "num_toks = num_toks or self.pcp_manager.get_num_tokens_for_dispatch(",
           "under PCP execute_model dispatches the global token count instead of the largest "
           "rank-local one: every rank pads to a graph far larger than its batch"),
    # the block tables, slot mappings and dummy runs execute_model drives
    Mutant("block-table-stale-padded-rows", _BT, "BlockTables.gather_block_tables",
           "_gather_block_tables_kernel[(self.num_kv_cache_groups, num_rows)](",
           "_gather_block_tables_kernel[(self.num_kv_cache_groups, num_reqs)](",
           "the gather stops clearing rows past the batch: a padded FULL-graph row keeps a "
           "previous batch's block ids (stale block-table row)"),
    Mutant("slot-mapping-offset-off-by-one", _BT, "BlockTables.compute_slot_mappings",
           "query_start_loc,\n        positions,\n",
           "query_start_loc,\n        positions + 1,\n",
           "every token's KV slot is computed one position late (wrong slot offset)"),
    Mutant("dummy-keeps-stale-positions", _IB, "InputBatch.make_dummy",
           "positions = input_buffers.positions[:num_tokens].zero_()",
           "positions = input_buffers.positions[:num_tokens]",
           "a dummy run no longer resets the shared positions buffer: it runs the previous "
           "real batch's positions"),
    Mutant("profile-tokens-padding", _MR, "GPUModelRunner.execute_model",
           "is_padding=not is_profile,",
           "is_padding=True,",
           "the profile run marks every dummy token as padding: MoE layers route none of them, "
           "so expert memory is never measured and the KV cache is sized too large"),
    # sample_tokens: what the runner hands back to the scheduler
    Mutant("output-keeps-unsampled-token", _AO, "AsyncOutput.get_output",
           "del token_ids[num_tokens:]",
           "del token_ids[num_tokens + 1:]",
           "the runner's output keeps one token past those sampled: a rejected draft, or a "
           "token for a prefill chunk that samples nothing, reaches the scheduler"),
)


# -- wiring: the paths execute_model, the dummy runs, capture, prepare_attn and the dispatch
# call hand on; each found by the valid campaign alone (tests/test_selftest_wiring.py)
_UT = "vllm.v1.worker.utils"
WIRING: tuple[Mutant, ...] = (
    # real step: the dispatch call
    Mutant("dispatch-one-token-short", _MR, "GPUModelRunner.execute_model",
           "        num_toks,\n        uniform_tok_count,",
           "        max(num_toks - 1, 1),\n        uniform_tok_count,",
           "execute_model dispatches one token fewer than the batch holds: an eager batch is "
           "described one token short, a batch of exactly a capture size pads to the one below"),
    Mutant("dispatch-drops-query-bound", _MR, "GPUModelRunner.execute_model",
           "        max_query_len=max_query_len,\n",
           "        max_query_len=None,\n",
           "execute_model no longer passes the decode batch's query bound: varlen FULL decode "
           "graphs are never chosen and decodes run PIECEWISE or eager"),
    Mutant("uniform-decode-needs-two-requests", _UT, "is_uniform_query_len",
           "return num_reqs > 0 and",
           "return num_reqs > 1 and",
           "the uniform-decode decision is off by one: a lone decode request is not uniform, so it "
           "misses its FULL decode graph"),
    # real step: prepare_attn
    Mutant("prepare-attn-block-table-rows-unpadded", _MR, "GPUModelRunner.prepare_attn",
           "num_reqs_padded=input_batch.num_reqs_after_padding,",
           "num_reqs_padded=input_batch.num_reqs,",
           "prepare_attn gathers block-table rows for the real requests only: a FULL graph "
           "replays its padded requests on whatever rows the shared buffer held"),
    Mutant("prepare-attn-slot-mappings-unpadded", _MR, "GPUModelRunner.prepare_attn",
           "num_tokens_padded=input_batch.num_tokens_after_padding,",
           "num_tokens_padded=input_batch.num_tokens,",
           "prepare_attn hands on slot mappings for the real tokens only: a graph replays its "
           "padded tokens without their PAD_SLOT_ID entries"),
    # idle DP dummy: _dummy_run and execute_model's dummy branch
    Mutant("idle-dummy-unpadded-tokens", _MR, "GPUModelRunner.execute_model",
           "            batch_desc.num_tokens,\n",
           "            num_toks,\n",
           "the idle dummy is built with the unpadded token count, not its descriptor's: an idle "
           "DP rank runs another shape than its peers' graph"),
    Mutant("idle-dummy-unpadded-requests", _MR, "GPUModelRunner.execute_model",
           "dummy_num_reqs = batch_desc.num_reqs or num_reqs",
           "dummy_num_reqs = num_reqs",
           "the idle dummy ignores its FULL descriptor's padded request count"),
    Mutant("idle-dummy-drops-query-bound", _MR, "GPUModelRunner.execute_model",
           "max_query_len=batch_desc.max_query_len,",
           "max_query_len=None,",
           "the idle dummy drops the query bound its varlen decode descriptor promises: the "
           "attention metadata is built for unbounded queries"),
    Mutant("dummy-run-uniform-requests-off-by-one", _MR, "GPUModelRunner._dummy_run",
           "num_reqs = num_tokens // self.decode_query_len\n",
           "num_reqs = num_tokens // self.decode_query_len + 1\n",
           "a uniform-decode dummy run counts one request too many, so its requests are no "
           "longer uniform (or empty)"),
    Mutant("dummy-block-tables-stale", _BT, "BlockTables.get_dummy_block_tables",
           "block_table[:num_rows].zero_()",
           "block_table[:num_rows]",
           "dummy block tables are no longer zeroed: a dummy after a real step writes through that "
           "step's (stale) block ids"),
    Mutant("dummy-slot-mappings-stale", _BT, "BlockTables.get_dummy_slot_mappings",
           "self.slot_mappings.fill_(PAD_SLOT_ID)",
           "self.slot_mappings[:, num_tokens:].fill_(PAD_SLOT_ID)",
           "dummy slot mappings are padded only past the dummy's tokens: its tokens keep the "
           "previous batch's slots (or the buffer's zeros) and write KV"),
    Mutant("pcp-dummy-block-tables-stale", _PCP, "PCPManager.get_dummy_block_tables",
           "block_table[:num_reqs].zero_() for block_table in self._local_block_tables",
           "block_table[:num_reqs] for block_table in self._local_block_tables",
           "under PCP the dummy's rank-local block tables keep the previous batch's rows"),
    Mutant("dummy-logits-past-batch", _IB, "InputBatch.make_dummy",
           "logits_indices = query_start_loc[1:] - 1",
           "logits_indices = query_start_loc[1:]",
           "a dummy's logits indices point one token past each request: the last one past the batch"),
    # profile run
    Mutant("profile-run-half-budget", _MR, "GPUModelRunner.profile_run",
           "self.max_num_tokens,\n        skip_attn=True,",
           "self.max_num_tokens // 2,\n        skip_attn=True,",
           "the profile run measures half the token budget: peak memory is underestimated and "
           "the KV cache sized too large"),
    # capture_model and its dummies
    Mutant("capture-dummy-ignores-request-count", _CG, "ModelCudaGraphManager.capture",
           "num_reqs = desc.num_reqs or min(num_tokens, self.max_num_reqs)",
           "num_reqs = min(num_tokens, self.max_num_reqs)",
           "a capture dummy ignores its FULL descriptor's request count: a uniform decode graph "
           "is captured on one request per token"),
    Mutant("capture-mixed-full-short-query-bound", _CG, "prepare_inputs_to_capture",
           "max_query_len = num_tokens\n",
           "max_query_len = max(num_tokens // 2, 1)\n",
           "a mixed FULL graph's capture dummy promises half its token count as the longest "
           "query, though the graph replays a single prefill spanning the batch"),
    Mutant("ubatch-seq-lens-truncate-first", _UB, "_slice_seq_lens",
           "out[last] -= (query_start_loc[req_stop] - tok_stop).clamp_(min=0)",
           "out[0] -= (query_start_loc[req_stop] - tok_stop).clamp_(min=0)",
           "a micro-batch shortens its first request's sequence length instead of the request "
           "straddling its end: attention reads KV the micro-batch has not written yet"),
    Mutant("capture-skips-widest-uniform-graph", _CG, "CudaGraphManager._init_candidates",
           "or rounded_num_reqs > self.max_num_reqs",
           "or rounded_num_reqs >= self.max_num_reqs",
           "the uniform decode graph for max_num_reqs requests is never captured: a full decode "
           "batch misses its FULL graph"),
)

# streaming input: a live request re-sent as new (its next input) must be re-added cleanly
STREAMING: tuple[Mutant, ...] = (
    Mutant("streaming-update-keeps-old-state", _MR, "GPUModelRunner.add_requests",
           "self._remove_request(req_id)\n\n        prompt_len",
           "pass  # the live request's old state is left in place\n\n        prompt_len",
           "a streaming-input update is added over the request's live state instead of replacing "
           "it: the old slot is never freed (and its model, LoRA and encoder state stay behind)"),
)

# The spec-decode outcome: a request that carries fewer drafts than the widest row of
# its batch and keeps them all loses its bonus token (vLLM 0.30-0.32 found a request's
# bonus logit as local position >= num_speculative_tokens, right only for K drafts).
SPEC_OUTCOMES: tuple[Mutant, ...] = (
    Mutant("bonus-row-lost-under-k", _IB, "get_num_sampled_and_rejected",
           "num_reqs = idx_mapping.shape[0]\n",
           "num_reqs = idx_mapping.shape[0]\n"
           "    widths = cu_num_logits[1 : num_reqs + 1] - cu_num_logits[:num_reqs]\n"
           "    num_sampled = torch.where((widths > 1) & (widths < widths.max()) & (num_sampled == widths),\n"
           "                              num_sampled - 1, num_sampled)\n",
           "a request with fewer drafts than the batch's widest row, every draft kept, loses its "
           "bonus token: one sampled token short, one more counted rejected"),
)

# The non-last pipeline-parallel rank's path (PP 2 configs; checks/pp_ranks.py).
_PP = "vllm.v1.worker.gpu.pp_utils"
PIPELINE: tuple[Mutant, ...] = (
    Mutant("pp-mask-drops-continuing-prefill", _PP, "compute_need_sampled_mask",
           "finished_prefill = prefill_len + 1 >= input_batch.max_seq_len_np",
           "finished_prefill = prefill_len + 1 < input_batch.max_seq_len_np",
           "the need-sampled mask drops a final prefill chunk whose request goes on decoding: no "
           "rank broadcasts its first token, and the non-last PP ranks decode a stale one"),
    Mutant("pp-non-last-skips-optimistic-update", _MR, "GPUModelRunner.sample_tokens",
           "        self.postprocess_num_computed_tokens(input_batch)\n        if not all_decode_next:",
           "        if not all_decode_next:",
           "a non-last PP rank no longer advances num_computed_tokens after its step: its "
           "request state falls behind the last rank's"),
)

# Faults that kill the process: a crash is a finding (simrig.supervision), never the end of a run.
CRASHES: tuple[Mutant, ...] = (
    Mutant("add-requests-segfault-half-way", _MR, "GPUModelRunner.add_requests",
           "req_index = self.req_states.req_id_to_index[req_id]\n",
           "req_index = self.req_states.req_id_to_index[req_id]\n"
           "        if req_index >= 3:  # a read through a wild pointer, half-way through the adds\n"
           "            __import__('ctypes').string_at(1)\n",
           "add_requests dies of SIGSEGV once it adds a request into slot 3 or above, with the "
           "requests before it added and the rest not: the process running it is gone"),
)

# LoRA: the adapter mapping execute_model hands _set_active_loras
LORA: tuple[Mutant, ...] = (
    Mutant("lora-stale-adapter-on-slot-reuse", "vllm.v1.worker.gpu.lora_utils", "LoraState.add_request",
           "else:\n        self.lora_ids[req_index] = NO_LORA_ID",
           "else:\n        pass",
           "a request without an adapter that takes a slot a LoRA request left runs that "
           "request's adapter: its prompt and token LoRA mappings carry the stale id"),
)

CATALOGUE = CATALOGUE + WIRING + STREAMING + SPEC_OUTCOMES + PIPELINE + CRASHES + LORA + SAMPLING

BY_NAME = {m.name: m for m in CATALOGUE}
