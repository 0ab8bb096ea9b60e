"""A step's ``grammar`` as the installed vLLM's ``GrammarOutput``, and the worker that applies it.

    Step.grammar {"r3": (12, 40), "r1": (7,)}           the trace: allowed ids, the scheduler's order
      -> GrammarOutput(structured_output_request_ids=["r3", "r1"],
                       grammar_bitmask=int32 [2, ceil(vocab / 32)])   one row per request, same order

The bitmask's meaning is vLLM's: bit j of word w set allows token 32*w + j (its kernel masks
a token whose bit is 0; the scheduler's all-permissive row is -1). Under drafts the step's set
holds on every logit row of the request, in the release's layout: one bitmask row per logit
row (k + 1) on 0.30-0.32, ``mask_stride`` rows per request on 0.33; ``num_acceptable_drafts``
(0.32+) is each request's k. Placeholder drafts (-1) are filled as vLLM's scheduler fills them:
rows after the first permissive, none acceptable (docs/sampling.md, "Under speculative decoding").
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


def rows_per_request_strided() -> bool:
    """Whether the installed worker reads ``mask_stride`` bitmask rows per grammar request
    (0.33) rather than one per logit row (0.30-0.32's ``_build_grammar_mapping``)."""
    from vllm.v1.worker.gpu import structured_outputs  # lazy: vllm loads after platform.configure()

    return not hasattr(structured_outputs, "_build_grammar_mapping")


def grammar_output(step: Step, spread: Collection[str], vocab_size: int, mask_stride: int = 1) -> Any:
    """The step's ``GrammarOutput`` for its grammar requests whose rows are spread (None when
    none is: a request under ``SIMRIG_SAMPLER=stand-in`` keeps one-hot rows and no mask);
    ``mask_stride``: 1 + num_speculative_tokens."""
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
    drafts = [step.spec_tokens.get(req_id, 0) for req_id, _ in listed]
    made_up = step.placeholder_drafts()  # after a -1 the scheduler's grammar constrains nothing
    permissive = range(vocab_size)  # every bit set: the scheduler's _full_mask
    strided = mask_stride > 1 and rows_per_request_strided()
    rows = [ids if j == 0 or req_id not in made_up else permissive
            for (req_id, ids), k in zip(listed, drafts) for j in range(mask_stride if strided else k + 1)]
    acceptable = [0 if req_id in made_up else k for (req_id, _), k in zip(listed, drafts)]
    extra = {"num_acceptable_drafts": acceptable} if "num_acceptable_drafts" in names else {}
    return GrammarOutput(structured_output_request_ids=[req_id for req_id, _ in listed],
                         grammar_bitmask=pack_bitmask(rows, vocab_size), **extra)
