"""Reproducer for vLLM's top-k/top-p sampling path (written by simrig repro).

Finding class: value_mismatch:postprocess:sampler.processed_logits
Where it shows: Sampler.sample -> apply_top_k_top_p (vllm/v1/sample/ops/topk_topp_sampler.py)
Property (top_p): SamplingParams.top_p: "Controls the cumulative probability of the top tokens to consider": the kept tokens are the most likely ones whose mass reaches top_p, and no more
Row: r0 sampled after position 3, from trace.jsonl

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

# The request's row: its logits are N(0, 2.5^2) per token, seeded by "id:position"
REQUEST = {'id': 'r0', 'position': 3, 'temperature': 0.0758, 'top_p': 0.0888}
VOCAB = 4096
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


def test_value_mismatch_postprocess_sampler_processed_logits():
    if ON_CPU:
        interpreted_range_yields_tensors()
    rng = np.random.default_rng(zlib.crc32(f"{REQUEST['id']}:{REQUEST['position']}".encode()))
    row = torch.from_numpy(rng.standard_normal(VOCAB, dtype=np.float32) * np.float32(2.5))
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
