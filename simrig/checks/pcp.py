"""PCP invariants: each rank's partition of the global batch (DualChunkSwap).

With P PCP ranks, every prefill query of length q is cut into 2P chunks of
ceil(q / 2P) tokens; rank r holds chunks r and 2P-1-r (empty chunks vanish):

    P = 2      | 0 | 1 | 2 | 3 |        rank 0: chunks 0, 3     rank 1: chunks 1, 2

Decodes are replicated on every rank, or, with shard_decode_requests, held
whole by exactly one owner (the n-th replicated row of the batch goes to rank
n mod P). With DCP > 1, prefills too short to fill all 2P chunks are
replicated like decodes. Each rank orders its rows decodes first, then
prefills, by global batch index then chunk offset; an idle rank carries one
empty row of the first request.

The global batch each rank is checked against is the reference model's
(``GlobalBatch``: query lengths, prefill flags, positions, input ids and slots
predicted from the Steps), not prepare_inputs' output, so a bug shared by
prepare and partition cannot hide. Layout rules and their sources in vLLM
(pcp_manager.py): "DualChunkSwap" split into 2P chunks, rank r holding
chunks r and 2P-1-r (PCPManager._iter_rank_chunks); decodes replicated, or
sharded with ParallelConfig.pcp_shard_decode_requests.

The manager keeps the global view: gathered = all ranks' rows, each padded to
the longest rank, rank-major; padded_gather_idx maps a gathered row to its
global token, hidden_restore_idx a global token to the gathered row that
restores it. So padded_gather_idx[hidden_restore_idx] == arange(num_tokens),
and every global token is KV-written exactly once (gathered_kv_write_mask).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.checks import findings as fk
from simrig.checks.contract import stage_req_ids
from simrig.checks.findings import Finding, guarded
from simrig.checks.reference import GlobalBatch, short
from simrig.observe import PARTITION, StageObs, StepObs
from simrig.step import RunnerConfig

Row = tuple[int, int, int]  # (global batch index, query offset, length)


def is_replicated(config: RunnerConfig, query_len: int, is_prefilling: bool) -> bool:
    """Is this request held whole (replicated or sharded), not split into chunks?

    Decodes always are; with DCP > 1 so are prefills too short to put a token
    in each of the 2P chunks of ceil(q / 2P) tokens.
    """
    if not is_prefilling:
        return True
    n_chunks = 2 * config.pcp_size
    size = -(-query_len // n_chunks)
    fills_all_chunks = (n_chunks - 1) * size < query_len
    return config.dcp_size > 1 and not fills_all_chunks


def expected_rows(config: RunnerConfig, rank: int, query_lens: np.ndarray,
                  is_prefilling: np.ndarray) -> list[Row]:
    """The rows PCP rank ``rank`` must hold, in its local order."""
    p = config.pcp_size
    n_chunks = 2 * p
    rows: list[tuple[bool, Row]] = []
    replicated_seen = 0
    for g, q in enumerate(int(x) for x in query_lens):
        if q == 0:
            continue
        if not is_replicated(config, q, bool(is_prefilling[g])):
            size = -(-q // n_chunks)
            for chunk in sorted({rank, n_chunks - 1 - rank}):
                start = chunk * size
                if start < q:
                    rows.append((True, (g, start, min(size, q - start))))
        else:
            owner = replicated_seen % p
            replicated_seen += 1
            if not config.shard_decode_requests or owner == rank:
                rows.append((bool(is_prefilling[g]), (g, 0, q)))
    rows.sort(key=lambda item: (item[0], item[1][0], item[1][1]))
    return [row for _, row in rows] or [(0, 0, 0)]


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
    """Every rank's rank-local batch and the manager's index maps, against the
    model's global batch ``expected`` (without one, against prepare's output:
    the weaker check for callers that have no model). ``desc``: the step's
    cudagraph descriptor; a graph pads every rank to its token count (and a
    FULL graph to its request count), padded tokens carrying id 0 at position 0."""
    out: list[Finding] = []
    if prepare.error is not None or not prepare.fields:
        return out
    if expected is not None:
        g_ids = tuple(expected.req_ids)
        q, pref, qsl = expected.query_lens, expected.is_prefilling, expected.query_start_loc
        g_pos, g_tok, g_idx = expected.positions, expected.input_ids, expected.slots
        g_nc = expected.num_computed
    else:
        g_ids = stage_req_ids(prepare)
        q = _arr(prepare, "num_scheduled_tokens")
        pref = _arr(prepare, "is_prefilling_np")
        qsl = _arr(prepare, "query_start_loc_np")
        g_pos, g_tok = _arr(prepare, "positions"), _arr(prepare, "input_ids")
        g_idx, g_nc = _arr(prepare, "idx_mapping_np"), _arr(prepare, "num_computed_tokens_np")
        if any(a is None for a in (q, pref, qsl, g_pos, g_tok, g_idx, g_nc)):
            return out
    n_tokens = int(q.sum())
    by_rank = {s.rank: s for s in partitions if s.rank is not None}
    held = np.zeros(n_tokens, dtype=np.int64)  # ranks holding each global token
    rows_by_rank = {r: expected_rows(config, r, q, pref) for r in range(config.pcp_size)}
    width = max(sum(n for _, _, n in rows) for rows in rows_by_rank.values())
    graph = desc is not None and desc.get("cg_mode") not in (None, "NONE")
    if graph:  # partition_batch pads every rank to the graph's token count
        width = max(width, int(desc["num_tokens"]))
    padded_reqs = desc.get("num_reqs") if graph and desc.get("cg_mode") == "FULL" else None
    for rank in range(config.pcp_size):
        stage = by_rank.get(rank)
        if stage is None or stage.error is not None or not stage.fields:
            continue
        o = _Out(index, stage, out)
        rows = rows_by_rank[rank]
        tok = np.concatenate([np.arange(int(qsl[g]) + off, int(qsl[g]) + off + n) for g, off, n in rows])
        o.equal("num_scheduled_tokens", [n for _, _, n in rows], _arr(stage, "num_scheduled_tokens"),
                "rank-local query lengths differ from the DualChunkSwap split")
        exp_ids = [g_ids[g] for g, _, _ in rows]
        if stage_req_ids(stage) != tuple(exp_ids):
            o.add("req_ids", exp_ids, list(stage_req_ids(stage)), "rank-local rows differ")
            continue  # row-wise comparisons below would only repeat this
        local_idx = _arr(stage, "idx_mapping")
        global_idx = prepare.fields.get("idx_mapping")
        if local_idx is not None and global_idx is not None and \
                stage.fields["idx_mapping"].dtype != global_idx.dtype:
            o.add("idx_mapping", global_idx.dtype, stage.fields["idx_mapping"].dtype,
                  "rank-local idx_mapping dtype differs from the global one", kind=fk.DTYPE_DRIFT)
        o.equal("idx_mapping", g_idx[[g for g, _, _ in rows]], local_idx,
                "rank-local idx_mapping != global idx_mapping[local -> global]")
        o.equal("idx_mapping_np", g_idx[[g for g, _, _ in rows]], _arr(stage, "idx_mapping_np"),
                "rank-local idx_mapping_np != global idx_mapping_np[local -> global]")
        n_local = len(tok)
        pos, ids = _arr(stage, "positions"), _arr(stage, "input_ids")
        pad_tail = np.zeros(width - n_local, dtype=np.int64)
        o.equal("positions", np.concatenate([g_pos[tok], pad_tail]), pos,
                "rank-local positions != global positions of the same tokens, then 0 for padding")
        o.equal("input_ids", np.concatenate([g_tok[tok], pad_tail]), ids,
                "rank-local input_ids != global input_ids of the same tokens, then 0 for padding")
        n_rows = max(len(rows), int(padded_reqs or 0))
        qsl_local = np.concatenate([[0], np.cumsum([n for _, _, n in rows])])
        o.equal("query_start_loc", np.concatenate([qsl_local, np.full(n_rows - len(rows), n_local)]),
                _arr(stage, "query_start_loc"),
                "rank-local query_start_loc is not the cumsum, then num_tokens for padded requests")
        starts = np.array([int(g_nc[g]) + off for g, off, _ in rows])
        lens = np.array([n for _, _, n in rows])
        o.equal("num_computed_tokens_np", starts, _arr(stage, "num_computed_tokens_np"),
                "rank-local context start != num_computed + chunk offset")
        if n_local:
            o.equal("seq_lens", np.concatenate([starts + lens, np.zeros(n_rows - len(rows))]),
                    _arr(stage, "seq_lens"),
                    "rank-local seq_lens != last position of the chunk + 1, then 0 for padded requests")
        pad = _arr(stage, "is_padding")
        o.equal("is_padding", np.arange(width) >= n_local, pad, "padding rows are not exactly the tail")
        _check_manager(o, stage, rank, tok, n_tokens, width)
        if n_local:
            np.add.at(held, tok, 1)
    _check_coverage(index, config, prepare, q, pref, held, by_rank, out)
    return out


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
        replicated = is_replicated(config, n, bool(pref[g]))
        want = 1 if not replicated or config.shard_decode_requests else config.pcp_size
        if not (counts == want).all():
            out.append(Finding(
                kind=fk.VALUE_MISMATCH, step=index, stage="partition", check="pcp",
                req_ids=(ids[g],), field="coverage",
                expected=f"each token on {want} rank(s)", actual=short(counts),
                message=f"request {ids[g]}: tokens held by {short(counts)} ranks"))


# What execute_model adds to the batch it runs, after partition: prepare_attn's
# block tables and slot mappings, and dcp_local_seq_lens (each DCP rank's own).
RUNNER_ONLY_PREFIXES = ("attn.", "dcp_local_seq_lens")


@guarded("pcp")
def check_dcp_peers(index: int, obs: StepObs) -> list[Finding]:
    """Every DCP rank of a PCP rank partitions the batch as DCP rank 0 does:
    DCP shards the KV cache, not the queries (``dcp_local_seq_lens_cpu_upper_bound``:
    "identical on every PCP rank"), so each field must match value for value."""
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
