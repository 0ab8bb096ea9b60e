"""A step's ``grammar`` as the installed vLLM's ``GrammarOutput``, and the worker that applies it.

    Step.grammar {"r3": (12, 40), "r1": (7,)}           the trace: allowed ids, the scheduler's order
      -> GrammarOutput(structured_output_request_ids=["r3", "r1"],
                       grammar_bitmask=int32 [2, ceil(vocab / 32)])   one row per request, same order

The bitmask's meaning is vLLM's: bit j of word w set allows token 32*w + j. The runner's
kernel (``_apply_grammar_bitmask_kernel``, v1/worker/gpu/structured_outputs.py) sets a logit
to -inf where ``((packed_bitmask >> j) & 1) == 0``, and the scheduler's all-permissive row is
``_full_mask = torch.tensor(-1, dtype=torch.int32)`` (v1/structured_output/__init__.py), every
bit set. A grammar is driven only without drafts (the reader refuses it under speculative
decoding), so each request has one logit row and one bitmask row in every release 0.30-0.33
(0.33's mask stride and 0.30-0.32's grammar mapping both give one then).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from simrig.step import Step
from simrig.vllm_api.entry_points import VllmApiError
from simrig.vllm_runtime import platform

# GrammarOutput's fields the rig fills; a later field must have a default (0.32's
# num_acceptable_drafts: None, "invalidates every draft", and a grammar step has none)
_NEEDED = ("structured_output_request_ids", "grammar_bitmask")


def pack_bitmask(allowed: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """One int32 row of ``ceil(vocab_size / 32)`` words per allowed set: bit ``t % 32`` of
    word ``t // 32`` set for each allowed token ``t``. # [len(allowed), words]"""
    words = np.zeros((len(allowed), -(-vocab_size // 32)), dtype=np.uint32)
    for row, tokens in enumerate(allowed):
        ids = np.asarray(tokens, dtype=np.int64)
        bits = np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32))
        np.bitwise_or.at(words[row], ids >> 5, bits)
    return words.view(np.int32)


def structured_outputs_worker(runner: Any, device: Any) -> Any:
    """vLLM's ``StructuredOutputsWorker`` with the arguments ``load_model`` gives it on the
    last PP rank (those the release's signature takes)."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker

    wanted = {"max_num_logits": runner.max_num_reqs * runner.decode_query_len, "vocab_size": runner.vocab_size,
              "device": device, "mask_stride": runner.decode_query_len,
              # 0.30-0.32: the model state's num_new_sampled_tokens_per_step, 1 for a text model
              "num_bonus_tokens": getattr(runner.model_state, "num_new_sampled_tokens_per_step", 1)}
    params = inspect.signature(StructuredOutputsWorker).parameters
    with platform.streams_without_cuda():  # its copy stream, on a CPU
        return StructuredOutputsWorker(**{k: v for k, v in wanted.items() if k in params})


def grammar_output(step: Step, spread: Collection[str], vocab_size: int) -> Any:
    """The step's ``GrammarOutput`` for its grammar requests whose rows are spread (None when
    none is: a request under ``SIMRIG_SAMPLER=stand-in`` keeps one-hot rows and no mask)."""
    listed = [(req_id, ids) for req_id, ids in step.grammar.items() if req_id in spread]
    if not listed:
        return None
    # lazy: vllm loads after platform.configure()
    from vllm import __version__
    from vllm.v1.core.sched.output import GrammarOutput

    names = [f.name for f in dataclasses.fields(GrammarOutput)] if dataclasses.is_dataclass(GrammarOutput) \
        else list(inspect.signature(GrammarOutput).parameters)
    missing = [name for name in _NEEDED if name not in names]
    if missing:
        raise VllmApiError("vllm.v1.core.sched.output", "GrammarOutput", __version__,
                           f"has no field {missing[0]}, so a trace's grammar cannot be handed to the "
                           f"runner (its fields: {', '.join(names)})")
    return GrammarOutput(structured_output_request_ids=[req_id for req_id, _ in listed],
                         grammar_bitmask=pack_bitmask([ids for _, ids in listed], vocab_size))
