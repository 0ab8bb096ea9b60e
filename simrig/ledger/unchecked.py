"""Every observed field: value-checked (and by which check), or listed here with the reason it is not.

``VALUE_CHECKED`` and ``UNCHECKED`` map (stage, field) to a line of text;
``"*"`` as the stage means every batch stage (prepare, partition, dummy,
capture, profile). ``tests/test_field_coverage.py`` drives the real vLLM through every
stage and fails when a stage observes a field neither table names, when a
field is in both, and when the oracle page's table of unchecked fields
(docs/oracle.md) is not ``readme_table()``. Every field also has its dtype
checked (contract.py) where the contract declares it; that is not a value check.
The sampling oracle's values (``sampler.*``, ``req_states.all_token_ids``,
``output.logprobs``, ``output.prompt_logprobs``) are observed in ``StepObs.sampled``, not as stage fields; its
findings name them under the postprocess stage, and so do their rows here.
"""

from __future__ import annotations

from simrig.ledger.evidence import REASONS

BATCH_STAGES = ("prepare", "partition", "dummy", "capture", "profile")

_REF = "reference (model prediction)"
_SEM = "semantics (relation among the batch's own fields, every batch)"
_FIELDS = "fields (model prediction, fields.py)"
_DUMMY = "dummy_batches"
_OFF = _DUMMY + ": its feature is never enabled, so its documented off value"
_PP = "pipeline (the non-last PP rank, pp_size > 1)"
_UB = "ubatch"
# vLLM's Sampler runs (vllm_sampling/switch.py) on steps without drafts, on releases whose Gumbel
# kernel Triton's interpreter runs (not 0.30.0); the sampling oracle judges those steps
_SAMPLING = "sampling (no drafts; not 0.30.0)"

VALUE_CHECKED: dict[tuple[str, str], str] = {
    # -- prepare_attn's outputs and execute_model's DCP lengths (blocks.py) --
    # (one block table per KV cache group: strategies draw up to 3 groups)
    **{("prepare", f"attn.block_tables.{g}"): "blocks (per group; sliding window: BELOW WINDOW); "
                                              "padding: one row per padded request"
       for g in range(3)},
    # a dummy's block tables and slot mappings (padded_attn.py): rows own no block, slots are PAD
    **{(s, f"attn.block_tables.{g}"): "padding: every dummy row the null block (rows given context "
                                      "excepted)" for s in ("dummy", "capture") for g in range(3)},
    **{(s, "attn.slot_mappings"): "padding: every dummy slot PAD_SLOT_ID" for s in ("dummy", "capture")},
    # rows of the shared block table past the rows handed over (blocks.py, padded_attn.py)
    **{(s, f"attn.filled_rows_past.{g}"): "blocks / padding: ROWS PAST, none (nothing a larger "
                                          "earlier batch left)"
       for s in ("prepare", "partition", "dummy", "capture") for g in range(3)},
    ("prepare", "attn.slot_mappings"): "blocks; padding: one slot per padded token",
    ("prepare", "dcp_local_seq_lens"): "blocks (DCP > 1; None otherwise); padding: every padded row "
                                       "its share of its seq_len",
    **{("partition", f"attn.block_tables.{g}"): "blocks (PCP rank 0, the rank the runner drives); "
                                                "padding: one row per padded request"
       for g in range(3)},
    ("partition", "attn.slot_mappings"): "blocks (PCP: the gathered mapping)",
    # _set_active_loras's arguments, on the batch they were built from (graph_rules/lora_inputs.py)
    **{(s, f"lora.{f}"): f"lora_inputs: {why}" for s in ("prepare", "partition") for f, why in (
        ("prompt_mapping", "PER REQUEST, each row its request's adapter from the trace (0: none)"),
        ("token_mapping", "PER TOKEN, each scheduled token its request's adapter (0: none)"),
        ("active_ids", "ACTIVE SET, the batch's distinct adapters"))},
    ("partition", "dcp_local_seq_lens"): "padding (PCP rank 0's batch, the one the runner drives): every "
                                         "row, padded ones included, its DCP rank's share of its seq_len",
    ("lifecycle", "runner.live_ids"): "runner_state: the model's live set",
    ("lifecycle", "runner.live_slots"): "runner_state: with the free slots, every slot once",
    ("lifecycle", "runner.free_slots"): "runner_state: with the live slots, every slot once",
    # each request a step adds (a streaming-input update included), as its slot holds it
    ("lifecycle", "runner.added.req_ids"): "readded: every request the step added",
    ("lifecycle", "runner.added.prompt_len"): "readded: the request's prompt length",
    ("lifecycle", "runner.added.prefill_len"): "readded: the tokens handed to the runner",
    ("lifecycle", "runner.added.num_computed"): "readded: the request's num_computed_tokens (a "
                                                "streaming update's resume point)",
    ("lifecycle", "runner.added.token_ids"): "readded: the prefill tokens (a streaming update's kept "
                                             "tokens, then its new input)",
    ("lifecycle", "runner.added.num_blocks"): "readded: its block list's length per group (written "
                                              "over, never appended to the old row)",
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
    ("postprocess", "sampled_tokens"): "spec_outcomes (model prediction, spec_outcomes.py): each row's "
                                       "accepted drafts, then the target's or the bonus token",
    ("postprocess", "post.last_sampled_tokens"): "spec_outcomes: the last token sampled (rows that "
                                                 "sampled one)",
    ("postprocess", "post.num_computed_tokens"): "spec_outcomes: computed + scheduled - rejected",
    ("postprocess", "output.req_ids"): _FIELDS + ": the batch's requests in batch order",
    ("postprocess", "output.num_sampled_tokens"): _FIELDS + ": exactly the tokens sampled",
    ("postprocess", "output.sampled_token_ids"): _FIELDS + ": the trace's token after each "
                                                 "accepted position; " + _SAMPLING + ": for a request "
                                                 "with parameters, the token sampled for its row",
    # -- what vLLM's Sampler made of each request's parameters (sampling_checks): observed in
    # StepObs.sampled, not as stage fields; the findings name these fields (stage postprocess)
    ("postprocess", "sampler.processed_logits"): _SAMPLING + ": the row Sampler.sample returned for a "
                                                 "request with parameters, against sampling/processing.py "
                                                 "(logit bias, min_tokens, penalties over the prompt and "
                                                 "output_bin_counts, bad words over the history, "
                                                 "temperature, min-p, top-k, top-p): support and values",
    ("postprocess", "sampler.sampled_token"): _SAMPLING + ": the token drawn for a request with parameters, "
                                              "inside the support of the row it was drawn from "
                                              "(temperature 0: the row's largest value)",
    ("postprocess", "sampler.grammar_mask"): _SAMPLING + " (grammar.py): a structured-output request's row "
                                             "is -inf at every token outside the set its grammar allows "
                                             "(its own bitmask row landed on it)",
    ("postprocess", "sampler.grammar_token"): _SAMPLING + " (grammar.py): the token sampled for a "
                                              "structured-output request, and handed out, is one its "
                                              "grammar allows",
    ("postprocess", "req_states.all_token_ids"): _SAMPLING + ": each request's stored history (to "
                                                 "total_len) is its prompt and every token it was given, "
                                                 "each step it samples",
    ("postprocess", "output.logprobs"): _SAMPLING + " (logprobs.py): present exactly when a request asks, "
                                        "as wide as the most asked plus the chosen token; the chosen "
                                        "token, its rank, the top tokens, values from the raw row; "
                                        "under drafts the rows the scheduler slices, one per token",
    ("postprocess", "output.prompt_logprobs"): "sampling (prompt_logprobs.py; drafts too): for a request that "
                                               "asks, one row per prompt position but the last, across "
                                               "chunks, once per admission; prompt token, rank, top "
                                               "tokens, values from the raw row; none for the others",
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
    ("capture", "max_query_len"): _SEM + "; capture: no dummy query is longer; padding: a mixed FULL "
                                  "graph's dummy promises its whole token count",
    ("capture", "desc.num_tokens"): "capture: the dummy holds exactly these tokens",
    ("capture", "desc.num_reqs"): "capture: the dummy has these requests",
    ("capture", "desc.uniform_token_count"): "capture: every dummy query has this length",
    ("capture", "desc.max_query_len"): "capture: no dummy query is longer",
    ("capture", "desc.num_active_loras"): "lora_capture: exactly the documented LoRA capture cases",
    # -- what each dummy batch is for (dummy_batches.py, each rule cited) --
    ("profile", "is_padding"): _DUMMY + ": every token real (profiling routes the dummy tokens to experts)",
    ("dummy", "is_padding"): _DUMMY + ": every token padding (no actual tokens to run)",
    ("capture", "is_padding"): _DUMMY + ": every token padding (capture marks dummy rows as padding)",
    ("profile", "num_tokens"): _SEM + "; " + _DUMMY + ": the whole token budget (below it only for "
                               "drafts' extra slots)",
    ("profile", "num_reqs"): _SEM + "; " + _DUMMY + ": 1..max_num_reqs",
    ("profile", "num_scheduled_tokens"): _SEM + "; " + _DUMMY + ": none longer than ceil(tokens / "
                                         "requests) nor max_model_len",
    ("profile", "max_query_len"): _SEM + ": no query is longer, when set (the eager profile "
                                  "descriptor promises none)",
    ("dummy", "max_query_len"): _SEM + ": no query is longer, when set; " + _DUMMY + ": carries its "
                                "descriptor's promised length",
    ("dummy", "desc.num_tokens"): _DUMMY + ": holds the step's tokens; the dummy has exactly these",
    ("dummy", "desc.num_reqs"): _DUMMY + ": the dummy has these requests, when set",
    ("dummy", "desc.max_query_len"): _DUMMY + ": the dummy batch carries it",
    ("dummy", "dcp_local_seq_lens"): _DUMMY + ": DCP rank 0's share of each dummy seq_len (None "
                                     "without DCP)",
    ("capture", "dcp_local_seq_lens"): _DUMMY + ": DCP rank 0's share of each dummy seq_len (None "
                                       "without DCP)",
    **{(s, "cu_num_logits_np"): _DUMMY + ": equals cu_num_logits (checked)"
       for s in ("dummy", "capture", "profile")},
    **{("*", f): _OFF for f in ("prompt_lens", "max_seq_len_np", "fast_prefill",
                                "num_admitted_draft_tokens", "has_structured_output_reqs")},
    ("gather", "max_seq_len_np"): _OFF,
    # -- the non-last PP rank against the last rank and the trace (checks/pp_ranks.py) --
    **{("pipeline", f"{side}.{f}"): _PP + ": both ranks' batches equal row by row (draft positions: the "
                                      "drafts the last rank broadcast)"
       for side in ("batch", "last") for f in ("req_ids", "input_ids", "positions", "seq_lens",
                                               "query_start_loc")},
    ("pipeline", "need_sampled_mask"): _PP + ": never a non-final prefill chunk; always a row that "
                                       "samples and may run again",
    ("pipeline", "num_computed_tokens"): _PP + ": computed + scheduled (the optimistic update)",
    ("pipeline", "last.num_computed_tokens"): _PP + ": computed + scheduled - rejected",
    ("pipeline", "last.draft_tokens"): _PP + ": what a later step's draft positions hold on the "
                                       "non-last rank",
    ("pipeline", "received"): _PP + ": the non-last rank's sample_tokens received",
    ("pipeline", "broadcasts.sent"): _PP + ": a step with a row that must be marked broadcasts",
    ("pipeline", "broadcasts.unreceived"): _PP + ": none (a broadcast is collective)",
    # -- micro-batching (graph_rules/ubatch_split.py) --
    ("dispatch", "uniform_decode"): _UB + ": a uniform decode exactly (every row a decode of "
                                    "decode_query_len tokens)",
    ("ubatch", "desc.num_ubatches"): _UB + " DECISION: split from the threshold of its kind",
    ("ubatch", "slice.tokens"): _UB + " TOKENS: the padded batch once, in order, at the midpoint",
    **{("ubatch", f): _UB + " TOKENS: the batch's tokens in its slice"
       for f in ("num_tokens", "num_tokens_after_padding", "positions", "is_padding")},
    **{("ubatch", f): _UB + " REQUESTS: the requests with a token in its slice, each its own tokens"
       for f in ("req_ids", "num_reqs", "num_reqs_after_padding", "num_scheduled_tokens",
                 "query_start_loc", "query_start_loc_np", "idx_mapping_np")},
    **{("ubatch", f): _UB + " SEQ LENS: less the request's tokens past the slice"
       for f in ("seq_lens", "seq_lens_cpu_upper_bound")},
}

# Every reason cites the vLLM line that makes it so (evidence.REASONS; tests/test_evidence.py
# re-reads each in the installed release and fails when it no longer says so).
UNCHECKED: dict[tuple[str, str], str] = {key: why for key, (why, _) in REASONS.items()}


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
