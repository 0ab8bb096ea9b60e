"""Seeded faults in vLLM's sampler state (``vllm/v1/worker/gpu/sample/``), its grammar
bitmask (``structured_outputs.py``) and the runner's stored token history, one per kind.

Each is found by the sampling oracle (``simrig/sampling_checks/oracle.py``) on a row of a
request with parameters (the stored history: any request's; a seed: ``seeds.py``): by a replay of a bundled
``traces/samples/sampling_*.jsonl`` and by the valid campaign alone (``simrig selftest
--fuzz-only``); docs/selftest.md has the times. Appended to ``simrig.selftest.catalogue.CATALOGUE``.
"""

from __future__ import annotations

from simrig.vllm_runtime.mutate import Mutant

_SAMPLE = "vllm.v1.worker.gpu.sample"

SAMPLING: tuple[Mutant, ...] = (
    # routing: a parameter read through the wrong index
    Mutant("sampling-top-k-by-batch-row", f"{_SAMPLE}.states", "SamplingStates.get_top_k_top_p",
           "top_k = self.top_k.gpu[expanded_idx_mapping] if do_top_k else None",
           "top_k = self.top_k.gpu[: expanded_idx_mapping.shape[0]] if do_top_k else None",
           "the top-k gather indexes the slot table by batch row instead of through the "
           "batch->slot mapping: a row is cut with another slot's k"),
    # slot reuse: a per-request count not reset when a slot is handed to a new request
    Mutant("sampling-bad-words-kept-on-slot-reuse", f"{_SAMPLE}.bad_words", "BadWordsState.add_request",
           "self.num_bad_words.np[req_idx] = 0",
           "pass",
           "a request without bad words keeps the bad-word count of its slot's last request: "
           "that request's words stay masked in the new request's rows"),
    # penalties history: the output counts of a newly admitted request not cleared
    Mutant("penalties-counts-not-cleared-on-admission", f"{_SAMPLE}.penalties", "bincount",
           "output_bin_counts.index_fill_(0, idx_long, 0)",
           "pass",
           "a request with penalties is admitted over the output counts its slot's earlier "
           "requests left: frequency, presence and repetition penalties hit tokens it never made"),
    # min-tokens: the length stop tokens are masked up to, counted from the wrong start
    Mutant("min-tokens-len-ignores-prompt", f"{_SAMPLE}.logit_bias", "LogitBiasState.add_request",
           "min_len = prompt_len + min_tokens",
           "min_len = min_tokens",
           "min_tokens counted as a sequence length instead of past the prompt: once the prompt "
           "is longer than min_tokens the stop tokens are never masked"),
    # prompt logprobs: a chunk boundary's row lost
    Mutant("prompt-logprobs-chunk-loses-its-last-row", f"{_SAMPLE}.prompt_logprob",
           "PromptLogprobsWorker.compute_prompt_logprobs",
           "if not req_is_prompt_chunked:",
           "if True:",
           "every chunk of a prompt drops its last row, as the final one drops the row that "
           "predicts the first output: each later row of a chunked prompt is one position off"),
    # structured output: a grammar bitmask row mapped onto the wrong request's logit row
    Mutant("grammar-mask-by-scheduler-position", "vllm.v1.worker.gpu.structured_outputs",
           "StructuredOutputsWorker.apply_grammar_bitmask",
           "req_id_to_idx[req_id] * self.mask_stride + position",
           "grammar_req_ids.index(req_id) * self.mask_stride + position",
           "a bitmask row is mapped to the logit row at the request's position in the scheduler's "
           "list instead of its batch row: where the batch order differs, a grammar masks a "
           "neighbour's row and leaves its own request unconstrained"),
    # structured output under drafts: every bitmask row of a request lands on its first logit row
    Mutant("grammar-mask-drafts-on-first-row", "vllm.v1.worker.gpu.structured_outputs",
           "StructuredOutputsWorker.apply_grammar_bitmask",
           "req_id_to_idx[req_id] * self.mask_stride + position",
           "req_id_to_idx[req_id] * self.mask_stride",
           "a grammar request's bitmask rows for its drafts and bonus token all land on its first "
           "logit row: the rows verifying its drafts go unmasked, and a token its grammar forbids "
           "can be kept or sampled there"),
    # stored history: the length after sampling written to a copy, never to the runner's state
    Mutant("history-length-never-advanced", "vllm.v1.worker.gpu.model_runner",
           "GPUModelRunner.postprocess_sampled",
           "self.req_states.total_len.gpu,",
           "self.req_states.total_len.gpu.clone(),",
           "a request's stored history (all_token_ids up to total_len) stays as admission wrote it: "
           "each sampled token is written over the last one past the prompt, so bad words and the "
           "n-gram drafter read a history without the tokens the request was given"),
    # logprobs: a row's logprobs computed from another request's logits (the vllm#33391 kind)
    Mutant("logprobs-from-the-previous-row", f"{_SAMPLE}.sampler", "Sampler.__call__",
           "compute_topk_scores(\n            logits,\n",
           "compute_topk_scores(\n            logits.roll(1, 0),\n",
           "the logprobs are computed over the logit rows shifted by one: each request is handed "
           "the previous row's top tokens and its own token's logprob and rank in that row"),
    # logprobs under drafts: each request's rows sliced from its batch index, not its first logit row
    Mutant("spec-logprobs-sliced-by-request-index", "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
           "RejectionSampler._get_logprobs_tensors",
           "cu_num_generated_tokens = cu_num_logits_np.tolist()",
           "cu_num_generated_tokens = list(range(len(cu_num_logits_np)))",
           "under drafts the logprobs' request boundaries are the batch indices instead of each "
           "request's first logit row: a request after one with drafts is handed that request's "
           "rows (the scheduler slices with slice_request)"),
    # seeds: the Gumbel stream keyed by the slot instead of the request's seed
    Mutant("seed-stream-keyed-by-slot", f"{_SAMPLE}.states", "SamplingStates.add_request",
           "self.seeds.np[req_idx] = seed",
           "self.seeds.np[req_idx] = req_idx",
           "a request's Gumbel noise is keyed by its slot instead of its seed: a seeded request's "
           "tokens change with the slot it lands in (its neighbours, a preemption), every token still "
           "inside its row's support; the seeds check (sampling_checks/seeds.py) finds it"),
)
