"""CUDA-graph dispatch and padding, from what the descriptor and the modes mean.

Each step's ``BatchExecutionDescriptor`` comes from vLLM's own dispatcher; it must hold
the batch, be a mode the config captures, not run eager when a captured graph fits and
be the smallest captured size that holds the batch (``check_dispatch``). Which graphs a
config captures (``captured_graphs``) comes from the documented meaning of the capture
sizes, never from vLLM's candidate lists; ``check_capture_sizes`` and ``check_capture``
judge the sizes in force and every capture dummy.

See docs/cudagraph.md, 'The dispatch and padding rules' for each rule and its vLLM source.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import CAPTURE, CAPTURE_SIZES, DISPATCH, StageObs
from simrig.partition.pcp_layout import dispatch_token_count
from simrig.reference.contract import stage_req_ids
from simrig.reference.descriptor import descriptor, padded_counts  # noqa: F401 -- re-exported
from simrig.reference.semantics import field_value
from simrig.step import SEPARATE_DECODE_MODES, RunnerConfig

# The runtime modes each configured mode may dispatch to (CUDAGraphMode
# decode_mode / mixed_mode, with NONE when no graph fits).
ALLOWED_MODES = {
    "NONE": {"NONE"},
    "PIECEWISE": {"PIECEWISE", "NONE"},
    "FULL": {"FULL", "NONE"},
    "FULL_DECODE_ONLY": {"FULL", "NONE"},
    "FULL_AND_PIECEWISE": {"FULL", "PIECEWISE", "NONE"},
}
MIXED_GRAPH_MODES = ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE")


def captured_graphs(config: RunnerConfig, kind: str, u: int | None = None) -> list[tuple[int, int | None]]:
    """(num_tokens, num_reqs) of the graphs of one kind the config captures, in
    increasing size, from what the capture sizes and descriptors mean:

    - "mixed" (any batch): one graph per capture size s ("cudagraph_capture_sizes:
      Sizes to capture cudagraph"). PIECEWISE pads no requests ("num_reqs None
      means no request padding is needed (PIECEWISE graphs)"); a FULL graph
      replays every batch of up to s tokens, so it holds as many requests as
      such a batch can have: one token each, at most max_num_reqs.
    - "varlen" (decodes of 1..decode_query_len tokens): "Varlen decode graphs take
      any mix of 1..decode_query_len tokens per request, worst case 1 token per
      request (or max_num_reqs)". Not documented: which sizes get one. A decode
      batch never exceeds max_num_reqs x decode_query_len tokens, so we expect
      the capture sizes up to that and no larger one.
    - "uniform" (every request u tokens): a uniform batch of r requests has r*u
      tokens, so the graph for capture size s holds the fewest whole requests
      that cover s (adjust_cudagraph_sizes_for_spec_decode rounds sizes up to
      "multiple of ... (num_speculative_tokens + 1)" the same way). Written per
      request count: r requests get a graph when a capture size lies in
      ((r-1)*u, r*u], r <= max_num_reqs, and r*u stays within the largest
      capture size ("max_cudagraph_capture_size: The maximum cudagraph capture
      size").
    """
    sizes = sorted(config.graph_capture_sizes or ())
    if not sizes:
        return []
    max_reqs = config.max_num_reqs
    if kind == "uniform":
        return [(r * u, r) for r in range(1, max_reqs + 1)
                if r * u <= sizes[-1] and any((r - 1) * u < s <= r * u for s in sizes)]
    if kind == "varlen":
        return [(s, min(s, max_reqs)) for s in sizes if s <= max_reqs * config.decode_query_len]
    return [(s, min(s, max_reqs) if config.cudagraph_mode == "FULL" else None) for s in sizes]


def sizes_in_force(config: RunnerConfig, desc: dict[str, Any] | None) -> RunnerConfig:
    """``config`` with the capture sizes the dispatch stage recorded (the runner's
    own); unchanged where none were recorded (eager mode, a hand-made observation)."""
    sizes = None if desc is None else desc.get(CAPTURE_SIZES)
    if sizes is None:
        return config
    return dataclasses.replace(config, capture_sizes=tuple(int(s) for s in sizes))


@guarded("dispatch")
def check_capture_sizes(index: int, config: RunnerConfig, sizes: list[int]) -> list[Finding]:
    """The SIZES rule (docs/cudagraph.md, 'The dispatch and padding
    rules') on the sizes the runner used."""
    out: list[Finding] = []

    def add(expected: Any, message: str) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=DISPATCH, check="dispatch",
                           field=CAPTURE_SIZES, expected=str(expected), actual=str(list(sizes)),
                           message=message))

    sizes = [int(s) for s in sizes]
    if sizes != sorted(set(sizes)):
        add("ascending, distinct", "the capture sizes are not in ascending order without repeats")
    budget = config.max_num_batched_tokens
    if any(not 1 <= s <= budget for s in sizes):
        add(f"each in [1, {budget}]", "a capture size lies outside the token budget")
    named = config.graph_capture_sizes
    if named and sorted(set(sizes)) != list(named):
        add(list(named), "the runner captures other sizes than the trace names")
    return out


@guarded("dispatch")
def check_dispatch(index: int, config: RunnerConfig, desc: dict[str, Any] | None,
                   q: np.ndarray | None, prefilling: np.ndarray | None,
                   as_decode: np.ndarray | None, req_ids: tuple[str, ...] = ()) -> list[Finding]:
    """The descriptor rules (docs/cudagraph.md, 'The dispatch and padding rules').
    ``q``, ``prefilling``: the model's query lengths and prefill flags in batch order; ``as_decode``: rows
    that run as decodes (decodes, and prefills of one new token over context)."""
    out: list[Finding] = []
    if desc is None or q is None or prefilling is None or not len(q):
        return out

    def add(name: str, expected: Any, actual: Any, message: str, pattern: str = "") -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=DISPATCH, check="dispatch",
                           req_ids=req_ids, field=name, expected=str(expected), actual=str(actual),
                           message=message, extra={"pattern": pattern} if pattern else {}))

    q = np.asarray(q, dtype=np.int64)
    num_reqs, has_prefill = len(q), bool(np.asarray(prefilling).any())
    tokens = int(q.sum())
    if config.pcp_size > 1:  # the largest rank-local batch, from the oracle's own layout
        tokens = dispatch_token_count(config, q, np.asarray(prefilling))
    mode, n_tok, n_req = desc["cg_mode"], int(desc["num_tokens"]), desc["num_reqs"]
    u, mql = desc.get("uniform_token_count"), desc.get("max_query_len")
    if n_tok < tokens:
        add("num_tokens", f">= {tokens}", n_tok, "the descriptor holds fewer tokens than the batch")
    if n_req is not None and n_req < num_reqs:
        add("num_reqs", f">= {num_reqs}", n_req, "the descriptor holds fewer requests than the batch")
    decodes_only = as_decode is not None and bool(np.asarray(as_decode).all())
    if u is not None and (not decodes_only or (q != u).any()):
        add("uniform_token_count", f"every query {u} tokens, each running as a decode", q.tolist(),
            f"a uniform-decode graph (u={u}) replays a batch that is not a uniform decode")
    if mql is not None and (has_prefill or int(q.max()) > mql):
        # the pattern separates a prefill admitted by the bound from a query over it
        add("max_query_len", f"no prefill, queries <= {mql}", q.tolist(),
            f"a graph bounded to queries of {mql} tokens replays a longer query or a prefill",
            "prefill_within_bound" if int(q.max()) <= mql else "query_over_bound")
    if mode not in ALLOWED_MODES[config.cudagraph_mode]:
        add("cg_mode", " or ".join(sorted(ALLOWED_MODES[config.cudagraph_mode])), mode,
            f"cudagraph_mode {config.cudagraph_mode} never runs a {mode} graph")
    separate = config.cudagraph_mode in SEPARATE_DECODE_MODES
    if separate and mode == "FULL" and u is None and mql is None:
        add("cg_mode", "a decode graph (uniform or varlen)", "an unbounded FULL graph",
            f"{config.cudagraph_mode} runs FULL graphs for decode batches only")
    sizes = config.graph_capture_sizes
    # a decode batch: every row runs as a decode (PCP included: a rank-local decode
    # batch is replicated or sharded decode rows, "tokens" is the largest rank's)
    # With varlen_decode the decode graphs are varlen ones (no uniform ones), and they need
    # max_query_len, which "the runner passes None for any batch with a prefill"
    # (BatchExecutionDescriptor): only prefill-free batches (PCP 1) fit them. Otherwise a
    # uniform decode graph takes any batch whose rows all run as decodes.
    dql = config.decode_query_len
    uniform = not config.varlen_decode and (decodes_only or not has_prefill) and bool((q == dql).all())
    varlen = config.varlen_decode and not has_prefill and config.pcp_size == 1 and int(q.max()) <= dql
    fits_decode = bool(sizes) and separate and (
        (uniform and any(t >= tokens for t, _ in captured_graphs(config, "uniform", dql)))
        or (varlen and any(t >= tokens for t, _ in captured_graphs(config, "varlen"))))
    if fits_decode and mode == "PIECEWISE":
        add("cg_mode", "FULL", mode, f"{config.cudagraph_mode}: a decode batch of {tokens} tokens "
            "fits a FULL decode graph but ran PIECEWISE")
    if mode == "NONE" and sizes:
        fits_mixed = config.cudagraph_mode in MIXED_GRAPH_MODES and tokens <= max(sizes)
        if fits_mixed or fits_decode:
            add("cg_mode", "a captured graph" if fits_mixed else "a FULL decode graph", "NONE",
                f"a batch of {tokens} tokens fits a captured graph but ran eager")
    elif mode != "NONE":
        kind = "uniform" if u is not None else "varlen" if mql is not None else "mixed"
        fitting = [(t, r) for t, r in captured_graphs(config, kind, u) if t >= tokens]
        if fitting:
            best_t, best_r = min(fitting)
            if n_tok != best_t:
                add("num_tokens", best_t, n_tok, f"padded to {n_tok} tokens; the smallest {kind} "
                    f"graph that holds {tokens} tokens has {best_t}")
            elif mode == "FULL" and n_req != best_r:
                add("num_reqs", best_r, n_req, f"a FULL {kind} graph of {n_tok} tokens holds "
                    f"{best_r} requests, the descriptor says {n_req}")
        else:
            add("num_tokens", f"no {kind} graph holds {tokens} tokens", n_tok,
                f"dispatched to a {kind} {mode} graph the config never captures")
        if mode == "PIECEWISE" and n_req is not None:
            add("num_reqs", None, n_req, "a PIECEWISE graph pads no requests")
    return out


@guarded("capture")
def check_capture(index: int, config: RunnerConfig, stage: StageObs) -> list[Finding]:
    """A capture dummy against the descriptor it was built for: the graph it
    records replays every batch dispatched to that descriptor."""
    out: list[Finding] = []
    if stage.stage != CAPTURE or stage.error is not None or not stage.fields:
        return out

    def add(name: str, expected: Any, actual: Any, message: str) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=CAPTURE, check="capture",
                           rank=stage.rank, req_ids=stage_req_ids(stage), field=name,
                           expected=str(expected), actual=str(actual), message=message))

    mode, n_tok, n_req, u, mql = (field_value(stage, "desc." + name) for name in (
        "cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len"))
    q = field_value(stage, "num_scheduled_tokens")
    if n_tok is None or q is None:
        return out
    q = np.asarray(q, dtype=np.int64)
    # A FULL graph replays exactly desc.num_reqs (padded) requests, so its dummy has that
    # many; "num_reqs None means no request padding is needed (PIECEWISE graphs)": the
    # dummy may then hold any count of non-empty requests the runner admits (make_dummy:
    # "0 < num_reqs <= num_tokens"), never a formula of vLLM's capture code.
    if field_value(stage, "num_tokens_after_padding") != n_tok or int(q.sum()) != n_tok:
        add("num_tokens", n_tok, int(q.sum()), f"the {mode} graph for {n_tok} tokens is captured "
            f"on a dummy of {int(q.sum())}")
    if n_req is not None and len(q) != int(n_req):
        add("num_reqs", n_req, len(q), f"the {mode} graph for {n_req} requests is captured "
            f"on a dummy of {len(q)}")
    elif n_req is None and not 0 < len(q) <= min(int(n_tok), config.max_num_reqs):
        add("num_reqs", f"1..{min(int(n_tok), config.max_num_reqs)}", len(q),
            f"the {mode} graph is captured on a dummy of {len(q)} requests")
    if (q < 1).any():
        add("num_scheduled_tokens", "every dummy request >= 1 token", q.tolist(),
            "a capture dummy holds an empty request")
    if u is not None and (q != u).any():
        add("num_scheduled_tokens", f"every query {u} tokens", q.tolist(),
            f"a uniform-decode graph (u={u}) is captured on a non-uniform dummy batch")
    promised = field_value(stage, "max_query_len")
    bound = mql if mql is not None else u
    if promised is not None and int(promised) < int(q.max()):
        add("max_query_len", f">= {int(q.max())}", promised,
            "the dummy promises a max query length below its own longest query")
    if bound is not None and int(q.max()) > int(bound):
        add("num_scheduled_tokens", f"queries <= {bound}", q.tolist(),
            "the capture dummy holds a query longer than the graph admits")
    return out
