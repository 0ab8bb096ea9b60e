"""Reproducer for vLLM's prompt logprobs under speculative decoding (written by simrig repro).

Finding class: value_mismatch:postprocess:output.prompt_logprobs
Where it shows: PromptLogprobsWorker.compute_prompt_logprobs (vllm/v1/worker/gpu/sample/prompt_logprob.py)
Property (prompt_logprobs): SamplingParams.prompt_logprobs: "Number of log probabilities to return per prompt token": a prompt of L tokens has L - 1 rows (the first token has none), none past its last position
Request: r0 (prompt 22, 21 computed at admission, 1 placeholder draft(s)), from trace.jsonl

The scheduler sends a request with one prompt token left to compute (a remote KV load or a
prefix-cache hit) with placeholder drafts ("Pad new decode requests to uniform spec decoding
size"): its final prefill chunk holds the prompt's last token and K draft rows. The worker drops
one row from a final chunk, so K rows past the prompt are handed out.

Fails on a vLLM that shows the class, passes where it is fixed. Run: pytest -q THIS_FILE
Needs only vllm, torch and numpy; without CUDA the Triton kernels run in Triton's interpreter.
"""
import inspect
import os
from types import SimpleNamespace

import numpy as np
import torch

ON_CPU = not torch.cuda.is_available()
if ON_CPU:
    os.environ.update(VLLM_TARGET_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker  # noqa: E402

REQUEST = {'id': 'r0',
 'prompt_len': 22,
 'num_computed_tokens': 21,
 'placeholder_drafts': 1,
 'prompt_logprobs': 0}
VOCAB = 4096
HIDDEN = 8


def test_value_mismatch_postprocess_output_prompt_logprobs():
    device = torch.device("cpu" if ON_CPU else "cuda")
    prompt_len, computed, drafts = REQUEST["prompt_len"], REQUEST["num_computed_tokens"], REQUEST["placeholder_drafts"]
    wanted = {"max_num_reqs": 1, "device": device}  # the arguments this release's worker takes
    worker = PromptLogprobsWorker(**{k: v for k, v in wanted.items()
                                     if k in inspect.signature(PromptLogprobsWorker).parameters})
    worker.add_request(REQUEST["id"], 0, SamplingParams(prompt_logprobs=REQUEST["prompt_logprobs"], max_tokens=4))
    q = 1 + drafts  # the prompt's last token, then the placeholder drafts
    batch = SimpleNamespace(  # the fields compute_prompt_logprobs reads of the runner's InputBatch
        req_ids=[REQUEST["id"]], idx_mapping_np=np.array([0], dtype=np.int32),
        idx_mapping=torch.tensor([0], dtype=torch.int32, device=device),
        num_computed_prefill_tokens_np=np.array([computed], dtype=np.int32),
        prefill_len_np=np.array([prompt_len], dtype=np.int32), num_scheduled_tokens=np.array([q], dtype=np.int32),
        num_tokens=q, query_start_loc=torch.tensor([0, q], dtype=torch.int32, device=device),
        query_start_loc_np=np.array([0, q], dtype=np.int32))
    all_token_ids = (torch.arange(prompt_len + q + 8, dtype=torch.int32, device=device) * 7 % VOCAB)[None]
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen).to(device)
    hidden = torch.randn(q, HIDDEN, generator=gen).to(device)
    out = worker.compute_prompt_logprobs(lambda h: h @ weight.T, hidden, batch, all_token_ids.contiguous(),
                                         torch.tensor([computed], dtype=torch.int32, device=device),
                                         np.array([prompt_len], dtype=np.int32))
    rows = 0 if REQUEST["id"] not in out else int(out[REQUEST["id"]].logprob_token_ids.shape[0])
    due = prompt_len - 1 - computed  # positions computed..prompt_len - 2 score the next prompt token
    assert rows == due, (
        f"compute_prompt_logprobs hands out {rows} row(s) for {REQUEST['id']}'s final chunk (prompt of "
        f"{prompt_len}, {computed} computed, {drafts} placeholder draft(s)); {due} are due: a row at the "
        f"prompt's last position or past it scores no prompt token")
