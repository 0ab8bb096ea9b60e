"""What a vLLM user sees of each upstream finding, and the title tag it earns.

An ``ISSUE.md`` written by ``simrig repro --upstream`` has an Impact section whose first line
(``FIRST_LINE``) says whether a user sees anything; ``tag`` turns that into the title's ``[Bug]`` or
``[Misc]``. Each class's ``Impact`` is written here, next to its entry in ``simrig/repro/upstream.py``;
``tests/test_upstream_impact.py`` holds every folder to it. See docs/bisect.md, 'From finding to fix'.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_LINE = "**Visible to users: {answer} — {what}**"


@dataclass(frozen=True)
class Impact:
    """What a user sees of a finding (``visible``, ``what``) and how that is known (``how``)."""

    visible: bool
    what: str  # one line, no '**'
    how: str  # the reproducer's observation or vLLM's code: file:line, function, the line's text


def tag(visible: bool) -> str:
    """The issue title's tag: a user-visible consequence is a bug, anything else Misc."""
    return "[Bug]" if visible else "[Misc]"


def section(impact: Impact) -> list[str]:
    """The ``## Impact`` section's lines."""
    first = FIRST_LINE.format(answer="yes" if impact.visible else "no", what=impact.what)
    return ["## Impact", "", first, "", impact.how]


_MR = "vllm/v1/worker/gpu/model_runner.py"
_IB = "vllm/v1/worker/gpu/input_batch.py"
_BT = "vllm/v1/worker/gpu/block_table.py"
_CG = "vllm/v1/worker/gpu/cudagraph_utils.py"
# Shared by the two positions findings: where a dummy's positions can go.
_POSITIONS_NEVER_REPLAYED = (
    f"A captured graph reads the persistent positions buffer (`{_CG}:690`, "
    "`ModelCudaGraphManager.capture` (`create_forward_fn`): "
    "`\"positions\": input_buffers.positions[:num_tokens]`), "
    "and every real step rewrites that buffer before it replays the graph "
    f"(`{_MR}:1499-1505`, `prepare_inputs`: `prepare_pos_seq_lens(..., "
    "self.input_buffers.positions, self.input_buffers.seq_lens)`)")

IMPACT: dict[str, Impact] = {
    "dtype_drift:dummy:logits_indices": Impact(
        False, "no consumer of a dummy's `logits_indices` depends on its dtype",
        f"The dummy's `logits_indices` is read once, as an index (`{_MR}:989`, `_dummy_run`: "
        "`sample_hidden_states = hidden_states[input_batch.logits_indices]`), which selects the "
        "same rows from an int32 or an int64 index. No captured graph reads it: the graph's inputs "
        f"are the input ids, the positions and the model state's inputs (`{_CG}:688-693`, "
        "`create_forward_fn`: `model_inputs = {\"input_ids\": ..., \"positions\": ...}`); the readers "
        "of a real batch's indices (`vllm/v1/worker/gpu/spec_decode/rejection_sampler.py:430`, "
        "`vllm/v1/worker/gpu/attn_utils.py:116`, `FastPrefillHelper.prepare`: "
        "`buf[:num_logits].copy_(logits_indices)` into its own int32 buffer) never see a dummy. "
        "An inconsistency: the same field has two dtypes, and a future consumer inside a graph "
        "would be captured with the one it does not replay with."),
    "missing_field:dummy:num_draft_tokens_per_req": Impact(
        False, "every consumer reads None as \"no drafts\", and no capture reads the field",
        f"`{_MR}:1428-1429`, `prepare_inputs`: `if num_draft_tokens_per_req is None: "
        "num_draft_tokens_per_req = np.zeros(num_reqs, dtype=np.int32)`, and the same in "
        "`vllm/v1/worker/gpu/model_states/mamba_hybrid.py:286-287` (`prepare_attn`); a FULL "
        "capture does not read it (mamba_hybrid.py:270-272: \"During CUDAGraph capture, "
        "num_decode_draft_tokens_cpu and num_accepted_tokens are created by "
        "attn_metadata_builder.build_for_cudagraph_capture\"); the samplers that read it "
        "(`sample/batch_shard.py`, `structured_outputs.py`) run on real batches only. "
        "An inconsistency: a dummy of a spec-decode batch's shape claims no per-request drafts."),
    "value_mismatch:dummy:positions": Impact(
        False, "positions of a dummy never reach a replayed graph or an output",
        _POSITIONS_NEVER_REPLAYED + ". A dummy run's own forward (DP idle steps, warmup) writes "
        f"no KV (`{_BT}:266`, `get_dummy_slot_mappings`: `self.slot_mappings.fill_(PAD_SLOT_ID)`) "
        "and its output is dropped. An inconsistency with the dummy's own `seq_lens`; a hazard "
        "only for code that would read a dummy's positions as a real batch's."),
    "value_mismatch:profile:positions": Impact(
        False, "the profiled memory peak does not depend on the positions' values",
        f"`{_MR}:1034-1039`, `profile_run`: `self._dummy_run(self.max_num_tokens, "
        "skip_attn=True, ...)`, so attention runs without metadata "
        f"(`{_MR}:1904-1909`: `block_tables, slot_mappings = None, None`) and returns before "
        "reading q and k, the only tensors the positions rotate "
        "(`vllm/v1/attention/backends/flash_attn.py:1226-1228`, `FlashAttentionImpl.forward`: "
        "`if attn_metadata is None: # Profiling run. return output.fill_(0)`). The peak depends on "
        "the shapes and, for MoE, on the routing, which vLLM drives from the input ids "
        f"(`{_MR}:1897-1899`: `input_batch.input_ids.random_(0, self.vocab_size)`), not from the "
        "positions. An inconsistency: the profiling forward's rows claim positions 0..q-1."),
    "value_mismatch:dispatch:cg_mode": Impact(
        True, "slower decode steps: decode-sharded PCP batches run PIECEWISE (or eager) instead "
        "of the FULL graph their rank-local batch fits",
        "The reproducer shows it: on a decode-only batch of 4 requests with PCP 2 and "
        "`shard_decode_requests`, `execute_model` dispatches PIECEWISE under FULL_AND_PIECEWISE "
        f"(`{_MR}:1832-1848`, `execute_model`: `dispatch_cg_and_sync_dp(self.cudagraph_manager, "
        "num_reqs, num_toks, ...)` with the global `num_reqs`). Outputs are the same; every "
        "such decode step pays the launches of attention outside a graph (under FULL_DECODE_ONLY "
        "the whole forward runs eagerly), the cost FULL decode graphs exist to remove."),
    "value_mismatch:capture:desc.num_active_loras": Impact(
        True, "`cudagraph_specialize_lora=False` saves none of the startup time and graph "
        "memory it documents: twice the graphs are captured",
        "The reproducer shows it: `capture_model` captures graphs with `num_active_loras=0` "
        "beside the LoRA-enabled ones (`vllm/v1/worker/gpu/lora_utils.py:35`, "
        "`get_lora_capture_cases`: `return [0, lora_config.max_loras + 1]`), the same set as "
        "with the option True and `specialize_active_lora` off. `vllm/config/compilation.py:664-669`, "
        "`cudagraph_specialize_lora`: \"Setting this to True will remove this overhead at the "
        "cost of increased startup time and slightly higher memory usage\": a user who sets it "
        "False to avoid that cost pays it anyway (outputs are unchanged)."),
    "value_mismatch:prepare:attn.block_tables.1": Impact(
        True, "possible wrong output (NaN) for a model with a sliding window of 1",
        f"`{_BT}:168-176`, `gather_block_tables`' docstring: entries below the window \"may "
        "already have been freed by the sliding-window manager and reused, while attention "
        "kernels can still load them as part of a KV tile that straddles the window start: "
        "masked-out NaN in such a tile propagates into the output\". The reproducer shows the "
        "freed block's id kept in the window-1 group's row after the window passed it "
        f"(`{_BT}:63`, `BlockTables.__init__`: `self.has_sliding_window_groups = any(r > 0 for r "
        "in sliding_window_reach)`, so a reach of 0 never nulls). Rare: few models use a window "
        "of 1."),
    "value_mismatch:partition:attn.filled_rows_past.0": Impact(
        False, "no kernel is handed the stale rows; a latent hazard",
        "The stale rows lie past the rows any consumer is handed: "
        f"`{_BT}:211`, `gather_block_tables`: `return tuple(bt[:num_reqs_padded] for bt in out)` "
        "after writing those rows, and `vllm/v1/worker/gpu/pcp_manager.py:767-769`, "
        "`PCPManager.get_dummy_block_tables`: `block_table[:num_reqs].zero_() for block_table in "
        "self._local_block_tables`. The hazard is the one 0.33.0 removed from the runner's own "
        f"tables (`{_BT}:219-221`, `get_dummy_block_tables`: \"Zero the rows so dummy runs write "
        "mamba state to the reserved null block rather than through the previous real step's "
        "(stale) block ids, which may point at blocks since freed and reallocated\"): freed "
        "block ids left in a persistent forward-pass buffer reach a kernel as soon as one reads "
        "past its own rows."),
    "value_mismatch:postprocess:sampler.processed_logits": Impact(
        True, "a low-temperature request with top-p samples tokens outside its top-p set",
        "The reproducer shows it: `apply_top_k_top_p` keeps all 4,096 tokens of the row where `apply_top_k_top_p_"
        "pytorch` keeps 1, and the sampler draws from that row (`vllm/v1/worker/gpu/sample/sampler.py:347-351`, "
        "`Sampler._sample_random`: `processed_logits = apply_top_k_top_p(...) ... sampled = gumbel_sample(processed_logits,`). "
        "On CUDA: top-p-only rows of batches over 64 rows; on other devices every top-p-only row."),
    "value_mismatch:postprocess:output.prompt_logprobs": Impact(
        True, "a request asking prompt logprobs gets extra rows scored past its prompt under speculative decoding",
        "The reproducer shows it: `compute_prompt_logprobs` hands out 1 row where 0 are due (prompt 22, 21 computed, 1 "
        "padded draft). The scheduler passes the rows on to the request's output, longer than its prompt: "
        "`vllm/v1/core/sched/scheduler.py:2507`, `Scheduler.update_from_output`: `prompt_logprobs_tensors = "
        "prompt_logprobs_dict.get(req_id)`."),
}
