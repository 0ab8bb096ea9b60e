"""PCP invariants: each rank's partition of the global batch, and the manager's global view.

Which tokens each rank holds comes from ``pcp_layout`` (DualChunkSwap, token by token,
from vLLM's documentation). ``check_pcp`` judges each rank-local batch (and
``check_dcp_peers`` every DCP peer of it) against the reference model's global batch, not
prepare_inputs' output, so a bug shared by prepare and partition cannot hide; the fields,
their expected values and sources, and the manager's gather/restore rules are tabled in
``check_pcp``'s docstring. See docs/oracle.md, 'PCP: which tokens each rank holds'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import PARTITION, StageObs, StepObs
from simrig.partition.pcp_layout import Row, dcp_largest_shard, is_replicated, rank_rows
from simrig.reference.contract import stage_req_ids
from simrig.reference.reference import GlobalBatch, short
from simrig.reference.semantics import field_value
from simrig.step import SYNTH_VOCAB_SIZE, RunnerConfig

# The harness builds its PCP managers without block tables, so with
# PCPManager's default cp_interleave of 1 (token-level DCP interleave).
CP_INTERLEAVE = 1


def _arr(stage: StageObs, name: str) -> np.ndarray | None:
    f = stage.fields.get(name)
    if f is None or f.kind not in ("numpy", "torch"):
        return None
    return np.asarray(f.values)


class _Out:
    def __init__(self, index: int, stage: StageObs, out: list[Finding]):
        self.index, self.stage, self.out = index, stage, out

    def add(self, name: str, expected: Any, actual: Any, message: str,
            req_ids: tuple[str, ...] | None = None, kind: str = fk.VALUE_MISMATCH) -> None:
        self.out.append(Finding(
            kind=kind, step=self.index, stage=self.stage.stage, check="pcp", rank=self.stage.rank,
            req_ids=stage_req_ids(self.stage) if req_ids is None else req_ids, field=name,
            expected=short(expected), actual=short(actual), message=message))

    def equal(self, name: str, expected: Any, actual: np.ndarray | None, what: str) -> None:
        if actual is None:
            return
        expected = np.asarray(expected)
        if actual.shape != expected.shape:
            self.add(name, expected, actual, f"{what} (shape {actual.shape}, expected {expected.shape})")
            return
        diff = np.flatnonzero(actual.astype(np.int64) != expected.astype(np.int64))
        if diff.size:
            at = int(diff[0])
            self.out.append(Finding(
                kind=fk.VALUE_MISMATCH, step=self.index, stage=self.stage.stage, check="pcp",
                rank=self.stage.rank, req_ids=stage_req_ids(self.stage), field=name,
                expected=short(expected, at=at), actual=short(actual, at=at),
                message=f"{what} ({diff.size} of {expected.size} differ, first at index {at})"))


@guarded("pcp")
def check_pcp(index: int, config: RunnerConfig, prepare: StageObs,
              partitions: list[StageObs], expected: GlobalBatch | None = None,
              desc: dict | None = None) -> list[Finding]:
    """Every rank-local batch (every DCP peer of every PCP rank) and the
    manager's index maps, against the model's global batch ``expected``
    (without one, against prepare's output: the weaker check for callers that
    have no model). ``desc``: the step's cudagraph descriptor; a graph pads
    every rank to its token count (and a FULL graph to its request count).

    Which tokens each rank holds, in which rows and order, comes from
    ``pcp_layout`` (DualChunkSwap written token by token from vLLM's
    documentation, with the source of every rule). Each rank-local batch (every
    DCP peer of it too) is judged against the reference model's global batch
    (``GlobalBatch``: query lengths, prefill flags, positions, input ids and slots
    predicted from the Steps), not prepare_inputs' output, so a bug shared by
    prepare and partition cannot hide:

        field                      expected                          source
        ─────                      ────────                          ──────
        req_ids, idx_mapping(_np)  the global request (and slot) of  pcp_layout ROWS
                                   each row; an idle rank: one row   (IDLE RANK: undocumented,
                                   of any request of the batch        our rule)
        num_scheduled_tokens       the row lengths                   pcp_layout
        positions, input_ids       the global values of the held     "rank-local DualChunkSwap rows"
                                   tokens; padded tokens in range     (PCPManager); padded values are
                                   (positions < max_model_len, ids    not documented: the global
                                   in the vocabulary)                 batch's rule (padding.py)
        query_start_loc            cumsum of the rows, then the      "Pad for full CUDA graph mode ...
                                   token count for FULL graphs'       non-decreasing" (prepare_inputs)
                                   padded requests
        num_computed_tokens_np     request's context + row offset    what the field means for a chunk
        seq_lens                   last position of the row + 1,     "pad unused seq_lens as 0 for
                                   then 0 for padded requests         full CUDA graphs"
        is_padding                 [num_tokens_after_padding]: the   InputBatch "# [num_tokens_after_
                                   tail past the rank's tokens; or,   padding]"; PCPManager: "Padding
                                   when vLLM gathers tokens for the   mask over the PCP-gathered rows
                                   MoE (moe_gathers_tokens, vLLM's    the MoE routes (rank-major)".
                                   default), P x width, rank-major,   The shape observed selects which
                                   each rank's own tail
        pcp.dcp_local_seq_lens_    None without DCP; with DCP the    PCPBatchMetadata: "set only under
          cpu_upper_bound          largest DCP shard of the row's     PCP+DCP"; partition_batch: "The
                                   whole request, 0 for padded rows   largest DCP shard of each row's
                                                                      whole request, identical on every
                                                                      PCP rank"

    The manager keeps the global view: gathered = all ranks' rows, each padded to
    the longest rank, rank-major; padded_gather_idx maps a gathered row to its
    global token, hidden_restore_idx a global token to the gathered row that
    restores it ("global = gathered[hidden_restore_idx] and padded_gathered =
    global[padded_gather_idx]"). So padded_gather_idx[hidden_restore_idx] ==
    arange(num_tokens), and every global token is KV-written exactly once
    (gathered_kv_write_mask).
    """
    out: list[Finding] = []
    if prepare.error is not None or not prepare.fields:
        return out
    glob = _global_view(prepare, expected)
    if glob is None:
        return out
    q, pref = glob["q"], glob["pref"]
    n_tokens = int(q.sum())
    rows_by_rank = rank_rows(config, q, pref)
    counts = [sum(n for _, _, n in rows) for rows in rows_by_rank]
    width = max(counts)
    graph = desc is not None and desc.get("cg_mode") not in (None, "NONE")
    if graph:  # a graph's token count pads every rank (BatchExecutionDescriptor)
        width = max(width, int(desc["num_tokens"]))
    # "num_reqs None means no request padding is needed (PIECEWISE graphs)"
    padded_reqs = desc.get("num_reqs") if graph and desc.get("cg_mode") == "FULL" else None
    held = np.zeros(n_tokens, dtype=np.int64)  # DCP-rank-0 stages holding each global token
    primary: dict[int, StageObs] = {}
    for stage in partitions:
        rank = stage.rank
        if rank is None or not 0 <= rank < config.pcp_size:
            continue
        if stage.dcp_rank in (None, 0):
            primary[rank] = stage
        if stage.error is not None or not stage.fields:
            continue
        _check_idx_dtype(_Out(index, stage, out), prepare)
        tok = _check_rank(_Out(index, stage, out), config, glob, rows_by_rank[rank], counts, width,
                          padded_reqs)
        if tok is None:
            continue
        if stage.dcp_rank in (None, 0):
            _check_manager(_Out(index, stage, out), stage, rank, tok, n_tokens, width)
            np.add.at(held, tok, 1)
    _check_coverage(index, config, prepare, q, pref, held, primary, out)
    return out


def _check_idx_dtype(o: _Out, prepare: StageObs) -> None:
    """The rank-local slot index is the global one, gathered: same dtype."""
    local, glob = o.stage.fields.get("idx_mapping"), prepare.fields.get("idx_mapping")
    if local is not None and glob is not None and local.dtype != glob.dtype:
        o.add("idx_mapping", glob.dtype, local.dtype, "rank-local idx_mapping dtype differs from the "
              "global one", kind=fk.DTYPE_DRIFT)


def _global_view(prepare: StageObs, expected: GlobalBatch | None) -> dict[str, Any] | None:
    """The global batch the ranks partition: the model's, else prepare's own output."""
    if expected is not None:
        return {"ids": tuple(expected.req_ids), "q": expected.query_lens, "pref": expected.is_prefilling,
                "qsl": expected.query_start_loc, "pos": expected.positions, "tok": expected.input_ids,
                "idx": expected.slots, "nc": expected.num_computed}
    view = {"ids": stage_req_ids(prepare), "q": _arr(prepare, "num_scheduled_tokens"),
            "pref": _arr(prepare, "is_prefilling_np"), "qsl": _arr(prepare, "query_start_loc_np"),
            "pos": _arr(prepare, "positions"), "tok": _arr(prepare, "input_ids"),
            "idx": _arr(prepare, "idx_mapping_np"), "nc": _arr(prepare, "num_computed_tokens_np")}
    return None if any(v is None for v in view.values()) else view


def _check_rank(o: _Out, config: RunnerConfig, glob: dict[str, Any], rows: list[Row],
                counts: list[int], width: int, padded_reqs: int | None) -> np.ndarray | None:
    """One rank-local batch against its rows; the global tokens it holds, or
    None when its rows are not the expected ones (row-wise checks would only
    repeat that)."""
    stage, g_ids = o.stage, glob["ids"]
    observed_ids = stage_req_ids(stage)
    if not rows:  # IDLE RANK (pcp_layout): one empty row, of any request of the batch
        if len(observed_ids) != 1 or observed_ids[0] not in g_ids:
            o.add("req_ids", "one empty row naming a request of this batch", list(observed_ids),
                  "a rank that holds no token must keep one empty row")
            return None
        rows = [(g_ids.index(observed_ids[0]), 0, 0)]
    o.equal("num_scheduled_tokens", [n for _, _, n in rows], _arr(stage, "num_scheduled_tokens"),
            "rank-local query lengths differ from the DualChunkSwap layout")
    exp_ids = [g_ids[g] for g, _, _ in rows]
    if observed_ids != tuple(exp_ids):
        o.add("req_ids", exp_ids, list(observed_ids), "rank-local rows differ from the DualChunkSwap layout")
        return None
    qsl, gs = glob["qsl"], [g for g, _, _ in rows]
    tok = np.concatenate([np.arange(int(qsl[g]) + off, int(qsl[g]) + off + n, dtype=np.int64)
                          for g, off, n in rows])
    o.equal("idx_mapping", glob["idx"][gs], _arr(stage, "idx_mapping"),
            "rank-local idx_mapping != the slots of its rows' requests")
    o.equal("idx_mapping_np", glob["idx"][gs], _arr(stage, "idx_mapping_np"),
            "rank-local idx_mapping_np != the slots of its rows' requests")
    n_local = len(tok)
    _held_then_padding(o, "positions", glob["pos"][tok], width, config.max_model_len)
    _held_then_padding(o, "input_ids", glob["tok"][tok], width, SYNTH_VOCAB_SIZE)
    n_rows = max(len(rows), int(padded_reqs or 0))
    qsl_local = np.concatenate([[0], np.cumsum([n for _, _, n in rows])])
    o.equal("query_start_loc", np.concatenate([qsl_local, np.full(n_rows - len(rows), n_local)]),
            _arr(stage, "query_start_loc"),
            "rank-local query_start_loc is not the cumsum, then num_tokens for padded requests")
    starts = np.array([int(glob["nc"][g]) + off for g, off, _ in rows])
    lens = np.array([n for _, _, n in rows])
    o.equal("num_computed_tokens_np", starts, _arr(stage, "num_computed_tokens_np"),
            "rank-local context start != num_computed + the row's query offset")
    if n_local:
        o.equal("seq_lens", np.concatenate([starts + lens, np.zeros(n_rows - len(rows))]),
                _arr(stage, "seq_lens"),
                "rank-local seq_lens != last position of the row + 1, then 0 for padded requests")
    _check_is_padding(o, config, counts, n_local, width)
    _check_dcp_upper_bound(o, config, glob, gs, n_rows)
    return tok


def _held_then_padding(o: _Out, name: str, held: np.ndarray, width: int, bound: int) -> None:
    """The held tokens' global values, then padded tokens anywhere in [0, bound)."""
    actual = _arr(o.stage, name)
    if actual is None:
        return
    if actual.shape != (width,):
        o.add(name, f"shape ({width},)", f"shape {actual.shape}",
              f"rank-local {name} is not padded to the widest rank ({width} tokens)")
        return
    o.equal(name, held, actual[:len(held)], f"rank-local {name} != the global {name} of the held tokens")
    tail = actual[len(held):].astype(np.int64)
    if ((tail < 0) | (tail >= bound)).any():
        o.add(name, f"padding in [0, {bound})", tail, f"a padded token's {name} is out of range")


# The rank-local batch's is_padding is the mask the forward context hands the MoE router
# ("is_padding=input_batch.is_padding"), and under PCP the MoE routes every rank's rows:
# without expert-parallel all2all kernels it all-gathers them (moe_runner._maybe_dispatch:
# "hidden_states = get_pcp_group().all_gather(hidden_states, dim=0)", 0.30.0-0.33.0).
MOE_NOT_GATHERED = "moe_rows_not_gathered"


def _check_is_padding(o: _Out, config: RunnerConfig, counts: list[int], n_local: int, width: int) -> None:
    """Under PCP the mask covers the rows the MoE routes: P x width, rank-major, each
    rank's own tail (PCPManager: "Padding mask over the PCP-gathered rows the MoE routes
    (rank-major)"). A mask of this rank's width leaves the other ranks' rows unmarked:
    one finding, the pattern MOE_NOT_GATHERED (a release whose MoE mask is never
    expanded). Without PCP: the tail past the batch's tokens."""
    pad = _arr(o.stage, "is_padding")
    if pad is None:
        return
    if config.pcp_size > 1 and pad.shape == (width,) and len(counts) == config.pcp_size:
        want = np.concatenate([np.arange(width) >= c for c in counts])
        o.out.append(Finding(
            kind=fk.VALUE_MISMATCH, step=o.index, stage=o.stage.stage, check="pcp", rank=o.stage.rank,
            req_ids=stage_req_ids(o.stage), field="is_padding", expected=f"shape ({want.size},): "
            + short(want), actual=f"shape {pad.shape}: " + short(pad), extra={"pattern": MOE_NOT_GATHERED},
            message=f"the MoE routes the {config.pcp_size} x {width} PCP-gathered rows, but the padding "
                    f"mask covers {width}: the other ranks' rows are not marked"))
        return
    if config.pcp_size > 1:
        want = np.concatenate([np.arange(width) >= c for c in counts])
        what = "the MoE's gathered padding mask is not each rank's tail, rank-major"
    else:
        want, what = np.arange(width) >= n_local, "padding rows are not exactly the tail"
    o.equal("is_padding", want, pad, what)


DCP_UPPER_BOUND_FIELDS = ("pcp.dcp_local_seq_lens_cpu_upper_bound", "dcp_local_seq_lens_cpu_upper_bound")


def _check_dcp_upper_bound(o: _Out, config: RunnerConfig, glob: dict[str, Any], gs: list[int],
                           n_rows: int) -> None:
    # one meaning under two names: the rank-local batch's own field until 0.32.0
    # (input_batch.py: "[num_reqs] set only under PCP+DCP"), PCPBatchMetadata's from 0.33.0
    # ("[num_reqs_after_padding], set only under PCP+DCP"), built by the same partition_batch lines
    name = next((n for n in DCP_UPPER_BOUND_FIELDS if n in o.stage.fields), None)
    if name is None:
        return
    value = field_value(o.stage, name)
    if config.dcp_size <= 1:
        if value is not None:
            o.add(name, None, value, "set although DCP is off (\"set only under PCP+DCP\")")
        return
    if value is None:
        o.add(name, "the largest DCP shard of each row's request", None, "missing under PCP+DCP")
        return
    whole = np.asarray(glob["nc"])[gs].astype(np.int64) + np.asarray(glob["q"])[gs].astype(np.int64)
    want = np.concatenate([dcp_largest_shard(whole, config.dcp_size, CP_INTERLEAVE),
                           np.zeros(n_rows - len(gs), dtype=np.int64)])
    o.equal(name, want, np.asarray(value), "not the largest DCP shard of each row's whole request "
            "(then 0 for padded rows)")


def _check_manager(o: _Out, stage: StageObs, rank: int, tok: np.ndarray, n_tokens: int, width: int) -> None:
    restore = _arr(stage, "manager.hidden_restore_idx")
    gather = _arr(stage, "manager.padded_gather_idx")
    mask = _arr(stage, "manager.gathered_kv_write_mask")
    if restore is None or gather is None:
        return
    o.equal("manager.padded_gather_idx", tok, gather[rank * width: rank * width + len(tok)],
            "this rank's slice of padded_gather_idx != its global tokens")
    if restore.shape != (n_tokens,) or restore.min(initial=0) < 0 or restore.max(initial=0) >= gather.size:
        o.add("manager.hidden_restore_idx", f"{n_tokens} indices into {gather.size} rows", short(restore),
              "restore map has the wrong length or points outside the gathered rows")
        return
    o.equal("manager.hidden_restore_idx", np.arange(n_tokens), gather[restore],
            "padded_gather_idx[hidden_restore_idx] != arange(num_tokens): a token is not restored exactly once")
    if len(np.unique(restore)) != n_tokens:
        o.add("manager.hidden_restore_idx", "distinct rows", short(restore), "two tokens restore from one row")
    if mask is not None:
        written = np.sort(gather[mask.astype(bool)])
        o.equal("manager.gathered_kv_write_mask", np.arange(n_tokens), written,
                "KV of every global token must be written exactly once")


def _check_coverage(index: int, config: RunnerConfig, prepare: StageObs, q: np.ndarray,
                    pref: np.ndarray, held: np.ndarray, by_rank: dict, out: list[Finding]) -> None:
    """From the observed rows of all ranks: split tokens once, replicated on all
    ranks (or on exactly one with shard_decode_requests)."""
    if len(by_rank) != config.pcp_size or any(s.error is not None for s in by_rank.values()):
        return
    ids = stage_req_ids(prepare)
    start = 0
    for g, n in enumerate(int(x) for x in q):
        counts = held[start:start + n]
        start += n
        if not n:
            continue
        sharded = config.shard_decode_requests and not bool(pref[g])
        want = 1 if sharded or not is_replicated(config, n, bool(pref[g])) else config.pcp_size
        if not (counts == want).all():
            out.append(Finding(
                kind=fk.VALUE_MISMATCH, step=index, stage="partition", check="pcp",
                req_ids=(ids[g],), field="coverage",
                expected=f"each token on {want} rank(s)", actual=short(counts),
                message=f"request {ids[g]}: tokens held by {short(counts)} ranks"))


# What execute_model adds to the batch it runs, after partition: prepare_attn's
# block tables and slot mappings, and dcp_local_seq_lens (each DCP rank's own); the
# LoRA mapping handed to _set_active_loras (observed on the driven rank only).
RUNNER_ONLY_PREFIXES = ("attn.", "dcp_local_seq_lens", "lora.")


@guarded("pcp")
def check_dcp_peers(index: int, obs: StepObs) -> list[Finding]:
    """Every DCP rank of a PCP rank partitions the batch as DCP rank 0 does:
    DCP shards the KV cache, not the queries (``dcp_local_seq_lens_cpu_upper_bound``:
    "identical on every PCP rank"), so each field must match value for value.

    A relation of vLLM with itself, and on 0.33.0 it cannot fail: partition_batch
    never reads dcp_rank (a release, or a mutant, that starts to would trip it).
    The value checks do not depend on it: check_pcp holds every DCP peer to the
    model's expectations on its own."""
    out: list[Finding] = []
    base = {s.rank: s for s in obs.stages if s.stage == PARTITION and s.dcp_rank == 0}
    for peer in obs.stages:
        if peer.stage != PARTITION or peer.dcp_rank == 0:
            continue
        ref = base.get(peer.rank)
        if ref is None or (ref.error is None) != (peer.error is None):
            out.append(Finding(
                kind=fk.VALUE_MISMATCH, step=index, stage=PARTITION, check="pcp", rank=peer.rank,
                req_ids=stage_req_ids(peer), field="error",
                expected=str(ref.error.type if ref is not None and ref.error else None),
                actual=str(peer.error.type if peer.error else None),
                message=f"DCP rank {peer.dcp_rank} of PCP rank {peer.rank} fails differently "
                        "from DCP rank 0"))
            continue
        for name in sorted(set(ref.fields) | set(peer.fields)):
            if name.startswith(RUNNER_ONLY_PREFIXES):
                continue  # observed only on the rank the runner drives; per-DCP-rank by meaning
            a, b = ref.fields.get(name), peer.fields.get(name)
            same = (a is not None and b is not None
                    and (a.kind, a.dtype, a.shape) == (b.kind, b.dtype, b.shape)
                    and _values_equal(a.values, b.values))
            if not same:
                out.append(Finding(
                    kind=fk.VALUE_MISMATCH, step=index, stage=PARTITION, check="pcp", rank=peer.rank,
                    req_ids=stage_req_ids(peer), field=name,
                    expected=short(a.values if a is not None else "missing"),
                    actual=short(b.values if b is not None else "missing"),
                    message=f"DCP rank {peer.dcp_rank} of PCP rank {peer.rank} differs from DCP rank 0"))
    return out


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b
