"""The step's cudagraph descriptor, as the dispatch stage observed it, and the
padded counts it commits a batch to (``BatchExecutionDescriptor``: "num_reqs None
means no request padding is needed"; prepare_inputs pads tokens to
``max(num_tokens, desc.num_tokens)``)."""

from __future__ import annotations

from typing import Any

from simrig.observe import DISPATCH, StepObs


def descriptor(obs: StepObs) -> dict[str, Any] | None:
    """The step's descriptor as the dispatch stage observed it (None: not dispatched)."""
    stage = obs.get(DISPATCH)
    if stage is None or stage.error is not None or "cg_mode" not in stage.fields:
        return None
    return {name: f.values for name, f in stage.fields.items()}


def padded_counts(desc: dict[str, Any] | None, num_tokens: int, num_reqs: int) -> tuple[int, int]:
    """(num_tokens_after_padding, num_reqs_after_padding) a batch handed ``desc`` must have."""
    if desc is None:
        return num_tokens, num_reqs
    return max(num_tokens, int(desc["num_tokens"])), int(desc["num_reqs"] or num_reqs)
