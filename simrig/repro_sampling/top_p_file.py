'''``simrig repro`` for a top-p row: the request's logit row (``spread_logits``) over its temperature through
``apply_top_k_top_p`` (vLLM's ``Sampler`` calls it), held to ``SamplingParams.top_p``'s meaning; on CPU in Triton's
interpreter with ``tl.range`` yielding tensors, as ``simrig.triton_interpreter`` runs it. See docs/bisect.md.
'''

from __future__ import annotations

import pprint
import re
from dataclasses import replace
from typing import Any

from simrig.errors import UsageError
from simrig.sampling.logits import SPREAD_SCALE
from simrig.sampling.params import SamplingSpec

CLASS = "value_mismatch:postprocess:sampler.processed_logits"
MEANING = ('SamplingParams.top_p: "Controls the cumulative probability of the top tokens to consider": '
           "the kept tokens are the most likely ones whose mass reaches top_p, and no more")


def request_row(steps: list[Any]) -> dict[str, Any]:
    """The first row a request with top-p samples: its id, position and parameters."""
    asks: dict[str, tuple[int, dict[str, float]]] = {}  # request -> (its prefill, its parameters)
    for step in steps:
        computed = {c.req_id: c.num_computed_tokens for c in step.cached}
        for new in step.new_requests:
            spec = new.sampling or SamplingSpec()
            if spec.top_p < 1.0:
                if spec.temperature == 0.0 or replace(spec, temperature=1.0, top_p=1.0, seed=None,
                                                      logprobs=None) != SamplingSpec():
                    raise UsageError(f"{new.req_id}: the top-p reproducer restates a temperature (not 0: greedy) "
                                     f"and top_p only (its spec: {spec.to_json()})")
                computed[new.req_id] = new.num_computed_tokens
                asks[new.req_id] = new.num_prefill_tokens, {"temperature": spec.temperature, "top_p": spec.top_p}
        for req_id, n in step.num_scheduled_tokens.items():
            if req_id in asks and computed.get(req_id, 0) + n >= asks[req_id][0]:
                return {"id": req_id, "position": computed[req_id] + n - 1, **asks[req_id][1]}
    raise UsageError(f"class {CLASS}: the trace samples no row of a request with top_p < 1 "
                     "(the reproducer states the top-p property only)")


def render(trace: str, steps: list[Any], test: str, vocab_size: int) -> str:
    """The file's text for the first top-p row of ``steps`` (from the trace named ``trace``)."""
    row = request_row(steps)
    fill = {"@@DATA@@": "REQUEST = " + pprint.pformat(row, sort_dicts=False) + f"\nVOCAB = {vocab_size}",
            "@@ROW@@": f"{row['id']} sampled after position {row['position']}, from {trace}", "@@TEST@@": test,
            "@@SCALE@@": repr(SPREAD_SCALE), "@@CLASS@@": CLASS, "@@MEANING@@": MEANING}
    return re.sub("@@[A-Z]+@@", lambda m: fill[m.group(0)], FILE)


FILE = r'''"""Reproducer for vLLM's top-k/top-p sampling path (written by simrig repro).

Finding class: @@CLASS@@
Where it shows: Sampler.sample -> apply_top_k_top_p (vllm/v1/sample/ops/topk_topp_sampler.py)
Property (top_p): @@MEANING@@
Row: @@ROW@@

Fails on a vLLM that shows the class, passes where it is fixed. Run: pytest -q THIS_FILE
Needs only vllm, torch and numpy; without CUDA the Triton kernel runs in Triton's interpreter.
"""
import os
import zlib

import numpy as np
import torch

ON_CPU = not torch.cuda.is_available()
if ON_CPU:
    os.environ.update(VLLM_TARGET_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p, apply_top_k_top_p_pytorch  # noqa: E402

# The request's row: its logits are N(0, @@SCALE@@^2) per token, seeded by "id:position"
@@DATA@@
ROWS = 1 if ON_CPU else 65  # on CUDA a batch of at most 64 rows takes the split pipeline
TOLERANCE = 0.01  # of the row's mass: the kernel finds its cut from sampled statistics


def interpreted_range_yields_tensors():
    """Triton's interpreter runs tl.range as Python's range; compiled, its variable is a tensor
    (the kernel calls row_id.to(tl.int64)). Plumbing of the interpreter, no kernel changed."""
    import triton.language as tl
    from triton.runtime import interpreter
    core, handle = interpreter._patch_lang_core, interpreter.TensorHandle
    def tensor_range(*args, **kwargs):
        ints = [int(np.asarray(a.handle.data).reshape(-1)[0]) if isinstance(a, tl.tensor)
                else int(tl.core._unwrap_if_constexpr(a)) for a in args if a is not None]
        for i in range(*ints):
            yield tl.tensor(handle(np.array(i, dtype=np.int32), tl.int32), tl.int32)
    interpreter._patch_lang_core = lambda lang, scope: [core(lang, scope),
                                                        scope.set_attr(lang, "range", tensor_range)]


def kept(out, logits):  # (tokens kept, their mass, the mass without the least likely kept token)
    probs = torch.softmax(logits.double(), dim=-1)[torch.isfinite(out)]
    return probs.numel(), probs.sum().item(), probs.sum().item() - probs.min().item()


def test_@@TEST@@():
    if ON_CPU:
        interpreted_range_yields_tensors()
    rng = np.random.default_rng(zlib.crc32(f"{REQUEST['id']}:{REQUEST['position']}".encode()))
    row = torch.from_numpy(rng.standard_normal(VOCAB, dtype=np.float32) * np.float32(@@SCALE@@))
    logits = (row / torch.tensor(REQUEST["temperature"], dtype=torch.float32)).repeat(ROWS, 1)
    p = torch.full((ROWS,), REQUEST["top_p"], dtype=torch.float32)
    out = apply_top_k_top_p(logits.clone(), None, p)
    n_ref = kept(apply_top_k_top_p_pytorch(logits[:1].clone(), None, p[:1])[0], logits[0])[0]
    for i in range(ROWS):
        n, mass, without_least = kept(out[i], logits[i])
        assert mass >= REQUEST["top_p"] - TOLERANCE and without_least < REQUEST["top_p"] + TOLERANCE, (
            f"apply_top_k_top_p: row {i} ({REQUEST['id']} at position {REQUEST['position']}, temperature "
            f"{REQUEST['temperature']}, top_p {REQUEST['top_p']}) keeps {n} tokens holding {mass:.4f} of the "
            f"mass, {without_least:.4f} without its least likely one; vLLM's apply_top_k_top_p_pytorch keeps {n_ref}")
'''
