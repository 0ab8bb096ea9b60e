'''``simrig repro`` for prompt-logprob rows past the prompt: a request's final prefill chunk with the
scheduler's placeholder drafts, as the scheduler hands it, through vLLM's own
``PromptLogprobsWorker.compute_prompt_logprobs``, held to ``SamplingParams.prompt_logprobs``'s
meaning (one row per prompt position but the last). See docs/bisect.md.
'''

from __future__ import annotations

import pprint
import re
from typing import Any

from simrig.errors import UsageError

CLASS = "value_mismatch:postprocess:output.prompt_logprobs"
MEANING = ('SamplingParams.prompt_logprobs: "Number of log probabilities to return per prompt token": '
           "a prompt of L tokens has L - 1 rows (the first token has none), none past its last position")


def request_chunk(steps: list[Any]) -> dict[str, Any]:
    """The first request asking prompt logprobs whose prompt completes in a step that carries
    placeholder drafts for it (sent as new with drafts: ``Step.placeholder_drafts``)."""
    for step in steps:
        made_up = step.placeholder_drafts()
        for new in step.new_requests:
            spec = new.sampling
            if new.req_id in made_up and spec is not None and spec.prompt_logprobs is not None:
                if new.num_prefill_tokens != new.prompt_len:
                    raise UsageError(f"{new.req_id}: the prompt-logprobs reproducer restates a first admission "
                                     "(its prefill is its prompt), not a resumption")
                drafts = step.spec_tokens[new.req_id]
                if new.num_computed_tokens + step.num_scheduled_tokens[new.req_id] - drafts != new.prompt_len:
                    raise UsageError(f"{new.req_id}: its placeholder drafts do not follow its prompt's last token")
                return {"id": new.req_id, "prompt_len": new.prompt_len, "num_computed_tokens": new.num_computed_tokens,
                        "placeholder_drafts": drafts, "prompt_logprobs": spec.prompt_logprobs}
    raise UsageError(f"class {CLASS}: the trace sends no request asking prompt logprobs with placeholder drafts "
                     "(the reproducer states rows past the prompt under drafts only)")


def render(trace: str, steps: list[Any], test: str, vocab_size: int) -> str:
    """The file's text for the first such request of ``steps`` (from the trace named ``trace``)."""
    req = request_chunk(steps)
    fill = {"@@DATA@@": "REQUEST = " + pprint.pformat(req, sort_dicts=False) + f"\nVOCAB = {vocab_size}",
            "@@ROW@@": (f"{req['id']} (prompt {req['prompt_len']}, {req['num_computed_tokens']} computed at admission, "
                        f"{req['placeholder_drafts']} placeholder draft(s)), from {trace}"),
            "@@TEST@@": test, "@@CLASS@@": CLASS, "@@MEANING@@": MEANING}
    return re.sub("@@[A-Z]+@@", lambda m: fill[m.group(0)], FILE)


FILE = r'''"""Reproducer for vLLM's prompt logprobs under speculative decoding (written by simrig repro).

Finding class: @@CLASS@@
Where it shows: PromptLogprobsWorker.compute_prompt_logprobs (vllm/v1/worker/gpu/sample/prompt_logprob.py)
Property (prompt_logprobs): @@MEANING@@
Request: @@ROW@@

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

@@DATA@@
HIDDEN = 8


def test_@@TEST@@():
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
'''
