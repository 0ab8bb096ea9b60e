"""Strategies for single requests as the scheduler first sends them.

    prompt_len  1 .. max_model_len        (a prompt may fill the whole context)
    max_tokens  1 .. max_new_tokens       (output budget)
    prefix hit  0, block_size, 2*block_size … < prompt_len   (prefix cache)
    lora_id     None (base model) or 1 .. max_loras  (LoRA adapter)
    sampling    None (vLLM's defaults) or a SamplingSpec  (strategies.sampling)
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from simrig.step import NewRequest
from strategies._validate import check_bool, check_int, check_strategy
from strategies.sampling import request_sampling, within_max_tokens


def prompt_lengths(*, max_model_len: int = 256, min_len: int = 1) -> st.SearchStrategy[int]:
    """Prompt lengths in ``min_len .. max_model_len - 1``; shrinks towards short prompts.
    A prompt leaves room for at least one output token: vLLM's input processor refuses a
    generate prompt of ``max_model_len`` tokens ("plus the number of requested output
    tokens (at least 1) is longer than the maximum model length")."""
    check_int("max_model_len", max_model_len, minimum=2)
    check_int("min_len", min_len, minimum=1, maximum=max_model_len - 1)
    return st.integers(min_len, max_model_len - 1)


def prefix_cache_hits(prompt_len: int, *, block_size: int = 16) -> st.SearchStrategy[int]:
    """Tokens a prefix-cache hit may cover: whole blocks, always leaving at least
    one token to compute (the scheduler never schedules zero tokens)."""
    check_int("prompt_len", prompt_len, minimum=1)
    check_int("block_size", block_size, minimum=1)
    max_blocks = (prompt_len - 1) // block_size
    return st.integers(0, max_blocks).map(lambda b: b * block_size)


@st.composite
def _new_requests(draw, max_model_len: int, max_new_tokens: int, block_size: int,
                  prefix_caching: bool, req_id: str | None, sampling: st.SearchStrategy) -> NewRequest:
    prompt_len = draw(prompt_lengths(max_model_len=max_model_len))
    hit = draw(prefix_cache_hits(prompt_len, block_size=block_size)) if prefix_caching else 0
    rid = req_id if req_id is not None else draw(request_ids())
    max_tokens = draw(st.integers(1, max_new_tokens))
    return NewRequest(req_id=rid, prompt_len=prompt_len, num_computed_tokens=hit, max_tokens=max_tokens,
                      sampling=within_max_tokens(draw(sampling), max_tokens))


def new_requests(*, max_model_len: int = 256, max_new_tokens: int = 16, block_size: int = 16,
                 prefix_caching: bool = True, req_id: str | None = None,
                 sampling: st.SearchStrategy | None = None) -> st.SearchStrategy[NewRequest]:
    """A ``simrig.step.NewRequest`` as sent on first arrival (never a resume). ``sampling``
    draws its sampling parameters (default ``request_sampling()``: a spec about one time in
    three, else None; ``st.none()``: always vLLM's defaults); a spec's ``min_tokens`` is
    lowered to the request's ``max_tokens`` where it is above."""
    check_int("max_model_len", max_model_len, minimum=1)
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("block_size", block_size, minimum=1)
    check_bool("prefix_caching", prefix_caching)
    if req_id is not None and (not isinstance(req_id, str) or not req_id):
        raise InvalidArgument(f"req_id={req_id!r} must be a non-empty string or None")
    sampling = request_sampling() if sampling is None else check_strategy("sampling", sampling)
    return _new_requests(max_model_len, max_new_tokens, block_size, prefix_caching, req_id, sampling)


def request_ids() -> st.SearchStrategy[str]:
    """Request ids shaped like vLLM's (``cmpl-<hex>-0``) plus short ones."""
    hexes = st.text("0123456789abcdef", min_size=1, max_size=8)
    return st.one_of(st.from_regex(r"\Ar[0-9]{1,3}\Z"), hexes.map(lambda h: f"cmpl-{h}-0"))


def lora_ids(max_loras: int) -> st.SearchStrategy[int | None]:
    """A request's LoRA adapter: None (the base model) or an id in 1 .. max_loras.
    Ids within 1 .. max_loras keep every batch within max_loras distinct
    adapters (LoRAConfig.max_loras: "Max number of LoRAs in a single batch")."""
    check_int("max_loras", max_loras, minimum=1)
    return st.one_of(st.none(), st.integers(1, max_loras))
