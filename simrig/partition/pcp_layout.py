"""Which tokens of the global batch each PCP rank holds, from what DualChunkSwap means.

Written from vLLM's documentation, never from ``PCPManager``'s code: the chunk each
prefill token lies in and its owner (``chunk_owner``), the requests held whole
(``is_replicated``), each rank's rows (``rank_rows``) and token counts, and the batch a
PCP step dispatches (``dispatch_token_count``). Where vLLM documents nothing the rule
chosen is said there.

See docs/oracle.md, 'PCP: which tokens each rank holds' for each rule and its source.
"""

from __future__ import annotations

import numpy as np

from simrig.step import RunnerConfig

Row = tuple[int, int, int]  # (global batch index, first query token, number of tokens)


def _chunk_len(query_len: int, pcp_size: int) -> int:
    """Tokens per DualChunkSwap chunk: 2P chunks, the last ones short or empty."""
    return -(-query_len // (2 * pcp_size))


def is_replicated(config: RunnerConfig, query_len: int, is_prefilling: bool) -> bool:
    """Is this request held whole (replicated, or sharded to one owner) rather than split?

    Decodes always are. With DCP > 1 so is a prefill whose 2P chunks are not
    all non-empty (the WHOLE rule, docs/oracle.md).
    """
    if not is_prefilling:
        return True
    if config.dcp_size <= 1:
        return False
    size = _chunk_len(query_len, config.pcp_size)
    non_empty_chunks = -(-query_len // size)
    return non_empty_chunks < 2 * config.pcp_size


def chunk_owner(token: np.ndarray, query_len: int, pcp_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(chunk, rank) of each token offset of a split prefill of ``query_len`` tokens."""
    chunk = token // _chunk_len(query_len, pcp_size)
    return chunk, np.minimum(chunk, 2 * pcp_size - 1 - chunk)


def rank_rows(config: RunnerConfig, query_lens: np.ndarray, is_prefilling: np.ndarray) -> list[list[Row]]:
    """Every rank's rows in its local order (the rules in docs/oracle.md, 'PCP: which
    tokens each rank holds'); a rank that holds no token gets an empty list (see IDLE RANK)."""
    p = config.pcp_size
    # per rank: one record per held token, (is_prefilling, global index, offset, chunk)
    held: list[list[np.ndarray]] = [[] for _ in range(p)]
    decode_ordinal = 0
    for g, q in enumerate(int(x) for x in query_lens):
        if q == 0:
            continue
        offsets = np.arange(q)
        prefilling = bool(is_prefilling[g])
        if is_replicated(config, q, prefilling):
            chunk, owners = np.zeros(q, dtype=np.int64), None
            if config.shard_decode_requests and not prefilling:
                owners = np.full(q, decode_ordinal % p)
                decode_ordinal += 1
        else:
            chunk, owners = chunk_owner(offsets, q, p)
        record = np.stack([np.full(q, int(prefilling)), np.full(q, g), offsets, chunk], axis=1)
        for rank in range(p):
            mine = record if owners is None else record[owners == rank]
            if len(mine):
                held[rank].append(mine)
    return [_rows_of(tokens) for tokens in held]


def _rows_of(tokens: list[np.ndarray]) -> list[Row]:
    """Group a rank's held tokens, in ORDER, into one row per (request, chunk)."""
    if not tokens:
        return []
    t = np.concatenate(tokens)
    t = t[np.lexsort((t[:, 2], t[:, 1], t[:, 0]))]  # decodes first, then batch and token order
    starts = np.flatnonzero(np.r_[True, (t[1:, 1] != t[:-1, 1]) | (t[1:, 3] != t[:-1, 3])])
    ends = np.r_[starts[1:], len(t)]
    return [(int(t[s, 1]), int(t[s, 2]), int(e - s)) for s, e in zip(starts, ends)]


def rank_token_counts(config: RunnerConfig, query_lens: np.ndarray, is_prefilling: np.ndarray) -> list[int]:
    """How many tokens each rank holds."""
    return [sum(n for _, _, n in rows) for rows in rank_rows(config, query_lens, is_prefilling)]


def dispatch_token_count(config: RunnerConfig, query_lens: np.ndarray, is_prefilling: np.ndarray) -> int:
    """The token count a PCP step dispatches: the largest rank-local batch
    (get_num_tokens_for_dispatch: "Return the largest real rank-local batch
    before graph padding"), from this module's layout."""
    return max(rank_token_counts(config, query_lens, is_prefilling))


def dcp_largest_shard(seq_lens: np.ndarray, dcp_size: int, interleave: int = 1) -> np.ndarray:
    """The largest DCP shard of each sequence. ParallelConfig.cp_kv_cache_interleave_size:
    "Store interleave_size tokens on dcp_rank i, then store next interleave_size
    tokens on dcp_rank i+1"; "Interleave_size=1: token-level alignment, where
    token `i` is stored on dcp_rank `i % dcp_world_size`". So shard d holds the
    tokens t with (t // interleave) % dcp_size == d; every shard is counted and
    the largest taken (not assumed to be rank 0's)."""
    out = np.zeros(len(seq_lens), dtype=np.int64)
    for i, n in enumerate(int(x) for x in seq_lens):
        shard = (np.arange(n) // interleave) % dcp_size
        out[i] = np.bincount(shard, minlength=dcp_size).max() if n else 0
    return out
