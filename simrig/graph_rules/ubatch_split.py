"""Micro-batches (DBO) and the ``uniform_decode`` flag, from what they mean.

``expected_uniform_decode`` judges the flag execute_model hands to
``dispatch_cg_and_sync_dp`` on every step, micro-batching on or off. With micro-batching on
(``RunnerConfig.num_ubatches`` > 1) ``check_ubatches`` holds vLLM's split decision and each
micro-batch (simrig.vllm_parts.ubatch records them) to vLLM's own words: the DECISION,
TOKENS, REQUESTS and SEQ LENS rules in its docstring. See docs/oracle.md, 'Micro-batches'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import DISPATCH, PARTITION, PREPARE, UBATCH, StageObs, StepObs
from simrig.partition.pcp_layout import dispatch_token_count
from simrig.reference.semantics import field_value
from simrig.step import RunnerConfig


def expected_uniform_decode(config: RunnerConfig, q: np.ndarray, as_decode: np.ndarray) -> bool:
    """A uniform decode: every row runs as a decode with ``decode_query_len`` tokens."""
    return bool(len(q)) and bool(np.asarray(as_decode).all()) and bool((np.asarray(q) == config.decode_query_len).all())


@guarded("ubatch")
def check_ubatches(index: int, config: RunnerConfig, obs: StepObs, q: np.ndarray | None,
                   prefilling: np.ndarray | None, as_decode: np.ndarray | None,
                   req_ids: tuple[str, ...] = ()) -> list[Finding]:
    """The module docstring's rules on one step (``q``, ``prefilling``, ``as_decode``:
    the reference's query lengths, prefill flags and decode rows in batch order).

    The ``uniform_decode`` flag execute_model hands to ``dispatch_cg_and_sync_dp`` is
    "Whether this rank's batch is a uniform decode, used to pick the microbatching split"
    (its docstring): every row runs as a decode and every query holds ``decode_query_len``
    tokens (the descriptor's meaning of a uniform decode, padding.py). It is judged on
    every step, micro-batching on or off.

    With micro-batching on (``RunnerConfig.num_ubatches`` > 1) the ubatch stage holds
    vLLM's split decision and, where it splits, each micro-batch of the batch the forward
    ran (simrig.vllm_parts.ubatch). The rules, each from vLLM's own words:

      DECISION     ParallelConfig: a batch "only containing decodes" is split from
                   ``dbo_decode_token_threshold`` tokens, one "that contain[s] one or more
                   prefills" from ``dbo_prefill_token_threshold``; the field docs say
                   "greater than", the validator says a batch below the threshold is kept
                   out ("the thresholds have to keep it out"), so a batch of exactly the
                   threshold may go either way; the count is the dispatch's (the largest
                   PCP rank's under PCP).
      TOKENS       "Split a DP-padded batch into the slices its microbatches run on"
                   (create_ubatch_slices), "at the midpoint": the token slices cover the
                   padded batch in order, no token twice or never, each within one token of
                   an even share but the last (which takes the rest); each micro-batch's
                   tokens (input_ids' positions, is_padding) are the batch's in its slice;
                   ``num_tokens`` counts the real ones, ``num_tokens_after_padding`` all.
      REQUESTS     "A request straddling the boundary appears in both microbatches, its
                   query truncated to the tokens each one owns" (_slice_input_batch): each
                   micro-batch lists, in batch order, the requests with a token in its
                   slice, each with the tokens it owns as its query; a request with no
                   token there only in a micro-batch "entirely inside the padding", whose
                   "request slice [is clamped] onto the last request ... with zero query
                   tokens"; the query lengths of a request over all micro-batches add up
                   to its query; ``idx_mapping_np`` names the same slots.
      SEQ LENS     "Only tokens past the end of this microbatch are missing; tokens it
                   owns in an earlier microbatch ... still count" (_slice_seq_lens): a
                   request's sequence length (and its host upper bound) is the batch's less
                   its tokens past the slice. (No DCP lengths: vLLM refuses DBO with
                   context parallelism.)
    """
    out: list[Finding] = []
    if q is None or prefilling is None or as_decode is None or not len(q):
        return out
    uniform = expected_uniform_decode(config, q, as_decode)
    dispatch = obs.get(DISPATCH)
    flag = dispatch.fields.get("uniform_decode") if dispatch is not None else None
    if flag is not None and flag.values is not None and bool(flag.values) != uniform:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=DISPATCH, check="ubatch",
                           req_ids=req_ids, field="uniform_decode", expected=str(uniform),
                           actual=str(bool(flag.values)),
                           message=f"uniform_decode says {bool(flag.values)} for query lengths "
                                   f"{np.asarray(q).tolist()} (decode_query_len {config.decode_query_len})"))
    stage = obs.get(UBATCH)
    if stage is None or stage.error is not None or "desc.num_ubatches" not in stage.fields:
        return out

    def add(name: str, expected: Any, actual: Any, message: str) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=UBATCH, check="ubatch",
                           req_ids=req_ids, field=name, expected=str(expected), actual=str(actual),
                           message=message))

    tokens = int(np.asarray(q).sum())
    if config.pcp_size > 1:
        tokens = dispatch_token_count(config, np.asarray(q), np.asarray(prefilling))
    threshold = config.dbo_decode_token_threshold if uniform else config.dbo_prefill_token_threshold
    n = int(stage.fields["desc.num_ubatches"].values)
    if tokens != threshold and n != (config.num_ubatches if tokens > threshold else 1):
        kind = "decode" if uniform else "prefill"
        add("desc.num_ubatches", config.num_ubatches if tokens > threshold else 1, n,
            f"a batch of {tokens} tokens against the {kind} threshold {threshold}: "
            + ("not split" if n == 1 else "split"))
    if n > 1:
        forward = obs.get(PARTITION, 0) if config.pcp_size > 1 else obs.get(PREPARE)
        if forward is not None and forward.error is None:
            _check_split(n, forward, stage, add)
    return out


def _check_split(n: int, batch: StageObs, stage: StageObs, add: Any) -> None:
    """TOKENS, REQUESTS and SEQ LENS against the forward batch the slices split."""
    def values(name: str) -> list[Any]:
        obs = stage.fields.get(name)
        return list(obs.values) if obs is not None and obs.values is not None else []

    tok_slices, req_lists = values("slice.tokens"), values("req_ids")
    if len(tok_slices) != n:
        add("slice.tokens", f"{n} micro-batches", len(tok_slices), "the split made another number of micro-batches")
        return
    num_tokens = int(field_value(batch, "num_tokens"))
    padded = int(field_value(batch, "num_tokens_after_padding"))
    ids = list(field_value(batch, "req_ids") or [])
    qsl = np.asarray(field_value(batch, "query_start_loc_np"), dtype=np.int64)[: len(ids) + 1]
    seq_lens = np.asarray(field_value(batch, "seq_lens"), dtype=np.int64)
    upper = field_value(batch, "seq_lens_cpu_upper_bound")
    positions = np.asarray(field_value(batch, "positions"))
    is_padding = field_value(batch, "is_padding")
    slots = np.asarray(field_value(batch, "idx_mapping_np"))
    bounds = [0] + [int(s[1]) for s in tok_slices]
    if [int(s[0]) for s in tok_slices] != bounds[:-1] or bounds[-1] != padded:
        add("slice.tokens", f"contiguous slices over [0, {padded})", tok_slices,
            "the token slices do not cover the padded batch once, in order")
        return
    share = padded / n
    if any(abs((b - a) - share) >= 1 for a, b in zip(bounds[:-2], bounds[1:-1])):
        add("slice.tokens", f"{share:g} tokens each (but the last)", tok_slices,
            "the split is not at the midpoint")
    owned_total = np.zeros(len(ids), dtype=np.int64)
    for i, (t0, t1) in enumerate(zip(bounds[:-1], bounds[1:])):
        _check_tokens(i, t0, t1, num_tokens, positions, is_padding, stage, add)
        own = np.clip(np.minimum(qsl[1:], t1) - np.maximum(qsl[:-1], t0), 0, None)
        want = [ids[j] for j in range(len(ids)) if own[j] > 0]
        got = list(req_lists[i]) if i < len(req_lists) and req_lists[i] is not None else []
        got_q = list(values("num_scheduled_tokens")[i] or [])
        if not want and t0 >= num_tokens and len(got) <= 1 and all(int(x) == 0 for x in got_q):
            continue  # entirely inside the padding: the clamped last request, no query
        if got != want:
            add("req_ids", want, got, f"micro-batch {i} (tokens {t0}..{t1}) does not hold the requests "
                                      "with a token in its slice, in batch order")
            continue
        for name, want_n in (("num_reqs", len(got)), ("num_reqs_after_padding", len(got))):
            n_obs = values(name)[i] if i < len(values(name)) else None
            if n_obs is not None and (int(n_obs) != want_n if name == "num_reqs" else int(n_obs) < want_n):
                add(name, want_n if name == "num_reqs" else f">= {want_n}", n_obs,
                    f"micro-batch {i} counts {n_obs} requests for {want_n} listed")
        rows = [ids.index(r) for r in want]
        owned_total[rows] += own[rows]
        _check_requests(i, rows, own, t1, qsl, seq_lens, upper, slots, values, add)
    if len(ids) and (owned_total != np.diff(qsl)).any():
        add("num_scheduled_tokens", np.diff(qsl).tolist(), owned_total.tolist(),
            "a request's query over the micro-batches does not add up to its query")


def _check_tokens(i: int, t0: int, t1: int, num_tokens: int, positions: np.ndarray, is_padding: Any,
                  stage: StageObs, add: Any) -> None:
    def at(name: str) -> Any:
        obs = stage.fields.get(name)
        return obs.values[i] if obs is not None and obs.values is not None and i < len(obs.values) else None

    real = max(0, min(t1, num_tokens) - t0)
    for name, want in (("num_tokens", real), ("num_tokens_after_padding", t1 - t0)):
        if at(name) is not None and int(at(name)) != want:
            add(name, want, at(name), f"micro-batch {i} (tokens {t0}..{t1}) counts {at(name)}")
    for name, whole in (("positions", positions), ("is_padding", is_padding)):
        got = at(name)
        if got is not None and whole is not None and list(np.asarray(got).tolist()) != np.asarray(whole)[t0:t1].tolist():
            add(name, np.asarray(whole)[t0:t1].tolist(), list(got),
                f"micro-batch {i} does not carry the batch's tokens {t0}..{t1}")


def _check_requests(i: int, rows: list[int], own: np.ndarray, t1: int,
                    qsl: np.ndarray, seq_lens: np.ndarray, upper: Any, slots: np.ndarray, values: Any,
                    add: Any) -> None:
    want_q = own[rows]
    got_q = np.asarray(values("num_scheduled_tokens")[i] or [], dtype=np.int64)
    if got_q.tolist() != want_q.tolist():
        add("num_scheduled_tokens", want_q.tolist(), got_q.tolist(),
            f"micro-batch {i}: query lengths are not the tokens each request owns")
    for name in ("query_start_loc", "query_start_loc_np"):
        got = np.asarray(values(name)[i] or [], dtype=np.int64)[: len(rows) + 1]
        want = np.concatenate([[0], np.cumsum(want_q)])
        if got.tolist() != want.tolist():
            add(name, want.tolist(), got.tolist(), f"micro-batch {i}: query offsets are not its own")
    missing = np.maximum(qsl[1:][rows] - t1, 0)  # each request's tokens past this slice
    for name, whole in (("seq_lens", seq_lens), ("seq_lens_cpu_upper_bound", upper)):
        if whole is None:
            continue
        want = (np.asarray(whole, dtype=np.int64)[rows] - missing).tolist()
        got = np.asarray(values(name)[i] or [], dtype=np.int64)[: len(rows)].tolist()
        if got != want:
            add(name, want, got, f"micro-batch {i}: a sequence length does not stop at its last token")
    got_slots = np.asarray(values("idx_mapping_np")[i] or [], dtype=np.int64)[: len(rows)].tolist()
    if got_slots != slots[rows].astype(np.int64).tolist():
        add("idx_mapping_np", slots[rows].tolist(), got_slots, f"micro-batch {i}: request slots differ")
