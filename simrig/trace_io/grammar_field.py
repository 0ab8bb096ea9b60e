"""A step's ``grammar`` object and a new request's ``structured_output`` flag, read and checked.

    new request   "structured_output": true         its outputs follow a grammar the scheduler holds
    step          "grammar": {"r3": [12, 40], ...}  request -> the token ids its grammar allows on its
                                                    logit row this step, ascending, each once; keys in
                                                    the order the scheduler lists them (vLLM's
                                                    GrammarOutput.structured_output_request_ids)

This module holds one line's rules (``parse_grammar``: a key names a request scheduled in the
step, a list is a non-empty ascending set of ids inside the stand-in vocabulary);
``simrig.trace_io.bounds.StepBounds`` holds those that span lines (the request was admitted
as structured; no speculative decoding). The format's spec is traces/README.md.
"""

from __future__ import annotations

from typing import Any

from simrig.step import SYNTH_VOCAB_SIZE


def parse_structured(raw: dict[str, Any], name: str, ln: Any) -> bool:
    """A new request's ``structured_output`` (absent: false). ``ln``: trace_format's ``_Line``
    (which imports this module), failing with FILE:LINE: field: problem."""
    value = raw.get("structured_output", False)
    if not isinstance(value, bool):
        raise ln.fail(f"{name}.structured_output", f"must be true or false, got {value!r}")
    return value


def parse_grammar(obj: dict[str, Any], ln: Any, scheduled: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The step's ``grammar`` object (absent: {}), in the order it lists its requests."""
    raw = ln.dict_(obj, "grammar", "grammar")
    out: dict[str, tuple[int, ...]] = {}
    for req_id, ids in raw.items():
        name = f"grammar.{req_id}"
        if not req_id:
            raise ln.fail("grammar", "a request id must be a non-empty string, got ''")
        if req_id not in scheduled:
            raise ln.fail(name, "request is not scheduled in this step (the scheduler sends a bitmask "
                          "row only for a request it schedules)")
        if not isinstance(ids, list) or not ids:
            raise ln.fail(name, f"must be a non-empty list of the token ids the grammar allows, got {ids!r}")
        previous = -1
        for j, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < SYNTH_VOCAB_SIZE:
                raise ln.fail(f"{name}[{j}]", f"must be a token id in [0, {SYNTH_VOCAB_SIZE}), got {token!r}")
            if token <= previous:
                raise ln.fail(f"{name}[{j}]", f"token ids must ascend, each once ({token} after {previous})")
            previous = token
        out[req_id] = tuple(ids)
    return out
