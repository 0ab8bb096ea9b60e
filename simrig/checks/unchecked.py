"""Every observed field: value-checked (and by which check), or listed here with the reason it is not.

``VALUE_CHECKED`` and ``UNCHECKED`` map (stage, field) to a line of text;
``"*"`` as the stage means every batch stage (prepare, partition, dummy,
capture). ``tests/test_field_coverage.py`` drives the real vLLM through every
stage and fails when a stage observes a field neither table names, when a
field is in both, and when the oracle page's table of unchecked fields
(docs/oracle.md) is not ``readme_table()``. Every field also has its dtype
checked (contract.py) where the contract declares it; that is not a value check.
"""

from __future__ import annotations

BATCH_STAGES = ("prepare", "partition", "dummy", "capture")

_REF = "reference (model prediction)"
_SEM = "semantics (relation among the batch's own fields, every batch)"
_FIELDS = "fields (model prediction, fields.py)"

VALUE_CHECKED: dict[tuple[str, str], str] = {
    # -- prepare_attn's outputs and execute_model's DCP lengths (blocks.py) --
    # (one block table per KV cache group: strategies draw up to 3 groups)
    **{("prepare", f"attn.block_tables.{g}"): "blocks (per group; sliding window: BELOW WINDOW)"
       for g in range(3)},
    ("prepare", "attn.slot_mappings"): "blocks",
    ("prepare", "dcp_local_seq_lens"): "blocks (DCP > 1; None otherwise)",
    **{("partition", f"attn.block_tables.{g}"): "blocks (PCP rank 0, the rank the runner drives)"
       for g in range(3)},
    ("partition", "attn.slot_mappings"): "blocks (PCP: the gathered mapping)",
    ("lifecycle", "runner.live_ids"): "runner_state: the model's live set",
    ("lifecycle", "runner.live_slots"): "runner_state: with the free slots, every slot once",
    ("lifecycle", "runner.free_slots"): "runner_state: with the live slots, every slot once",
    ("gather", "req_ids"): "reference: the batch-order rules; prepare's order equals it",
    ("gather", "num_scheduled_tokens"): _REF,
    ("gather", "num_tokens"): _FIELDS,
    ("gather", "num_draft_tokens_np"): _REF + " when drafts are scheduled; None otherwise (contract)",
    ("gather", "idx_mapping_np"): "reference: slots distinct, in range, stable, equal across stages",
    ("gather", "prefill_len_np"): _REF,
    ("gather", "num_computed_prefill_tokens_np"): _REF,
    ("gather", "is_prefilling_np"): _REF,
    ("gather", "has_prefill"): _REF,
    ("gather", "prefill_runs_as_decode_np"): _FIELDS + " (PCP 1; None under PCP: known)",
    ("gather", "decode_graph_eligible"): _FIELDS,
    ("dispatch", "cg_mode"): "dispatch: a captured mode, decodes FULL, no needless eager",
    ("dispatch", "num_tokens"): "dispatch: holds the batch, smallest fitting capture size",
    ("dispatch", "num_reqs"): "dispatch: holds the batch's requests",
    ("dispatch", "uniform_token_count"): "dispatch: only a uniform decode batch",
    ("dispatch", "max_query_len"): "dispatch: no prefill, no longer query",
    ("dispatch", "capture_sizes"): "dispatch: ascending, within the budget, the trace's when named "
                                   "(graph modes only; the padding rules read them)",
    ("dispatch", "num_active_loras"): "lora_dispatch: the capture case of the batch's distinct adapters",
    ("postprocess", "num_sampled"): _FIELDS,
    ("postprocess", "num_rejected"): _FIELDS,
    ("postprocess", "output.req_ids"): _FIELDS + ": the batch's requests in batch order",
    ("postprocess", "output.num_sampled_tokens"): _FIELDS + ": exactly the tokens sampled",
    ("postprocess", "output.sampled_token_ids"): _FIELDS + ": the trace's token after each "
                                                 "accepted position",
    # -- the global batch (prepare) --
    ("prepare", "req_ids"): _REF, ("prepare", "num_tokens"): _REF,
    ("prepare", "num_tokens_after_padding"): _REF + " (the descriptor's padding)",
    ("prepare", "num_reqs_after_padding"): _REF + " (the descriptor's padding)",
    ("prepare", "query_start_loc"): _REF, ("prepare", "query_start_loc_np"): _REF,
    ("prepare", "seq_lens"): _REF, ("prepare", "seq_lens_cpu_upper_bound"): _REF,
    ("prepare", "num_computed_tokens_np"): _REF, ("prepare", "is_prefilling_np"): _REF,
    ("prepare", "input_ids"): _REF, ("prepare", "positions"): _REF, ("prepare", "is_padding"): _REF,
    ("prepare", "cu_num_logits"): _REF, ("prepare", "cu_num_logits_np"): _REF,
    ("prepare", "logits_indices"): _REF, ("prepare", "expanded_idx_mapping"): _REF,
    ("prepare", "idx_mapping"): _REF + " (slots)", ("prepare", "idx_mapping_np"): _REF + " (slots)",
    ("prepare", "num_scheduled_tokens"): _REF,
    ("prepare", "num_draft_tokens"): _FIELDS, ("prepare", "num_draft_tokens_per_req"): _FIELDS,
    ("prepare", "prefill_runs_as_decode_np"): _FIELDS, ("prepare", "decode_graph_eligible"): _FIELDS,
    ("prepare", "prefill_len_np"): _FIELDS, ("prepare", "num_computed_prefill_tokens_np"): _FIELDS,
    ("prepare", "pcp"): _FIELDS + ": None on the global batch",
    ("prepare", "has_prefill"): _SEM, ("prepare", "num_reqs"): _SEM,
    ("prepare", "expanded_local_pos"): _SEM,
    # -- rank-local batches (partition) --
    ("partition", "req_ids"): "pcp: the rows each rank holds", ("partition", "num_scheduled_tokens"): "pcp",
    ("partition", "idx_mapping"): "pcp", ("partition", "idx_mapping_np"): "pcp",
    ("partition", "positions"): "pcp", ("partition", "input_ids"): "pcp",
    ("partition", "query_start_loc"): "pcp", ("partition", "num_computed_tokens_np"): "pcp",
    ("partition", "seq_lens"): "pcp", ("partition", "is_padding"): "pcp",
    ("partition", "manager.hidden_restore_idx"): "pcp: restores the global order",
    ("partition", "manager.padded_gather_idx"): "pcp: restores the global order",
    ("partition", "manager.gathered_kv_write_mask"): "pcp: every token's KV written once",
    ("partition", "pcp.global_num_tokens"): _FIELDS,
    ("partition", "pcp.global_query_lens_np"): _FIELDS,
    ("partition", "pcp.global_seq_lens_cpu_upper_bound_np"): _FIELDS,
    ("partition", "pcp.dcp_local_seq_lens_cpu_upper_bound"): "pcp: None without DCP; with DCP the largest "
                                                             "DCP shard of each row's request, every peer",
    # -- every batch, real and dummy: relations among its own fields --
    **{(s, f): _SEM for s in ("*",) for f in (
        "query_start_loc_np", "query_start_loc", "seq_lens", "positions", "is_prefilling_np",
        "prefill_len_np", "num_computed_prefill_tokens_np", "num_computed_tokens_np", "has_prefill",
        "decode_graph_eligible", "expanded_idx_mapping", "expanded_local_pos", "logits_indices",
        "cu_num_logits", "num_reqs", "num_tokens", "num_reqs_after_padding",
        "num_tokens_after_padding", "num_draft_tokens", "seq_lens_cpu_upper_bound",
        "num_scheduled_tokens")},
    ("capture", "max_query_len"): _SEM + "; capture: no dummy query is longer",
    ("capture", "desc.num_tokens"): "capture: the dummy holds exactly these tokens",
    ("capture", "desc.num_reqs"): "capture: the dummy has these requests",
    ("capture", "desc.uniform_token_count"): "capture: every dummy query has this length",
    ("capture", "desc.max_query_len"): "capture: no dummy query is longer",
    ("capture", "desc.num_active_loras"): "lora_capture: exactly the documented LoRA capture cases",
}

UNCHECKED: dict[tuple[str, str], str] = {
    ("dummy", "desc.cg_mode"): "the dummy run's own descriptor: parity compares shapes only when it is "
                               "the real batch's",
    ("dummy", "desc.num_tokens"): "the dummy run's own descriptor (see desc.cg_mode)",
    ("dummy", "desc.num_reqs"): "the dummy run's own descriptor (see desc.cg_mode)",
    ("dummy", "desc.uniform_token_count"): "the dummy run's own descriptor (see desc.cg_mode)",
    ("dummy", "desc.max_query_len"): "the dummy run's own descriptor (see desc.cg_mode)",
    ("dummy", "desc.num_active_loras"): "the dummy run's own descriptor (see desc.cg_mode)",
    ("partition", "dcp_local_seq_lens"): "PCP with DCP: each DCP rank's share of the rank-local batch; "
                                         "only dtype (blocks.py judges it without PCP)",
    ("dummy", "dcp_local_seq_lens"): "None: the dummy stage does not run execute_model's DCP step",
    ("capture", "dcp_local_seq_lens"): "None: the capture stage does not run execute_model's DCP step",
    ("*", "prompt_lens"): "R-SWA only, never enabled; None is its documented value",
    ("*", "max_seq_len_np"): "pipeline parallel only, never enabled; None is its documented value",
    ("gather", "max_seq_len_np"): "pipeline parallel only, never enabled; None is its documented value",
    ("*", "fast_prefill"): "KV-sharing fast prefill, never enabled; None is its documented value",
    ("*", "num_admitted_draft_tokens"): "adaptive verification, never enabled; None is its documented value",
    ("*", "has_structured_output_reqs"): "traces carry no structured output",
    ("prepare", "max_query_len"): "always None on 0.33.0: prepare_inputs sets it only under adaptive "
                                  "verification, which the rig never enables; the reference and semantics "
                                  "checks compare it only when set, so here they cannot fail",
    ("partition", "max_query_len"): "always None: partition_batch keeps the global batch's (None, see "
                                    "prepare); semantics compares it only when set",
    ("dummy", "max_query_len"): "always None: the eager dummy is built without a promised query length "
                                "(only capture dummies get one, and those are checked)",
    ("lifecycle", "runner.pcp_size"): "the PCP world the harness drove (1 where the release cannot drive "
                                      "the configuration); it selects what the checks expect",
    ("gather", "uniform_decode_token_count"): "judged through the descriptor it dispatches (dispatch)",
    ("partition", "cu_num_logits_np"): "rank-local logits are never sampled (vLLM's comment); "
                                       "cu_num_logits itself is related to the rows",
    ("partition", "num_draft_tokens_per_req"): "None on every rank-local batch: local logits are never "
                                               "sampled; num_draft_tokens is 0 accordingly",
    ("partition", "prefill_runs_as_decode_np"): "None on every rank-local batch (a known finding); "
                                                "decode_graph_eligible is related instead",
    ("dummy", "cu_num_logits_np"): "placeholder copy of cu_num_logits (checked) for a draft-free dummy",
    ("capture", "cu_num_logits_np"): "placeholder copy of cu_num_logits (checked) for a draft-free dummy",
    ("dummy", "req_ids"): "random placeholder ids by design (make_dummy)",
    ("capture", "req_ids"): "random placeholder ids by design (make_dummy)",
    ("dummy", "input_ids"): "placeholder zeros by design (make_dummy)",
    ("capture", "input_ids"): "placeholder zeros by design (make_dummy)",
    ("dummy", "is_padding"): "placeholder: all padding by design (make_dummy)",
    ("capture", "is_padding"): "placeholder: all padding by design (make_dummy)",
    ("dummy", "idx_mapping"): "placeholder slots 0..n-1 (make_dummy); parity checks dtype and shape",
    ("dummy", "idx_mapping_np"): "placeholder slots 0..n-1 (make_dummy); parity checks dtype and shape",
    ("capture", "idx_mapping"): "placeholder slots 0..n-1 (make_dummy)",
    ("capture", "idx_mapping_np"): "placeholder slots 0..n-1 (make_dummy)",
    ("dummy", "num_draft_tokens_per_req"): "None by design: the dummy is draft-free (parity: known)",
    ("capture", "num_draft_tokens_per_req"): "None by design: the dummy is draft-free",
    ("dummy", "prefill_runs_as_decode_np"): "None by design: the dummy has no prefill (parity: known)",
    ("capture", "prefill_runs_as_decode_np"): "None by design: the dummy has no prefill",
    ("dummy", "pcp"): "None unless PCP capture staging sets it; its fields are the partition's",
    ("capture", "pcp"): "None unless PCP capture staging sets it; its fields are the partition's",
    ("partition", "pcp"): "a group: its fields (pcp.*) are listed one by one",
    ("capture", "desc.cg_mode"): "which descriptors vLLM captures is not predicted (capture sizes "
                                 "are vLLM's choice); the descriptor is the yardstick of its dummy",
}


def lookup(table: dict[tuple[str, str], str], stage: str, field: str) -> str | None:
    """The entry for (stage, field), a ``"*"`` entry for a batch stage, else None."""
    if (stage, field) in table:
        return table[(stage, field)]
    if stage in BATCH_STAGES and ("*", field) in table:
        return table[("*", field)]
    return None


def readme_table() -> str:
    """The table of fields with no value expectation on the oracle page (docs/oracle.md),
    generated from UNCHECKED."""
    rows = ["| stage | field | why it has no value expectation |", "|---|---|---|"]
    for (stage, field), why in sorted(UNCHECKED.items()):
        rows.append(f"| {'every batch' if stage == '*' else stage} | `{field}` | {why} |")
    return "\n".join(rows)
