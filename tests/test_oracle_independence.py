"""The oracle's new rules against a differently written formulation of the same documented meaning.

Each rule in simrig/checks/fields.py and semantics.py is restated here row by
row, straight from the vLLM comment it cites, and both must agree on random
inputs (no vLLM needed). A rule that silently drifted from its meaning (or
was rewritten to mirror an implementation) disagrees on some input.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simrig.checks.fields import decode_graph_eligible, runs_as_decode
from simrig.observe import FieldObs, StageObs
from simrig.reference.semantics import check_batch_semantics

rows = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40), st.integers(1, 6), st.integers(0, 3)),
                min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(rows)
def test_runs_as_decode_and_eligibility_agree_with_the_comments(batch):
    """InputBatch: "prefilling rows that schedule one new prompt token (excluding drafts) over
    existing context ... compute exactly like decodes"; "No prefills, or only prefill rows that
    run as decodes." Restated per row with plain Python."""
    nc = np.array([r[0] for r in batch])
    prefill_len = np.array([r[0] + r[1] for r in batch])  # prefill_len > nc: still prefilling ...
    prefill_len[::2] = nc[::2]  # ... except every other row, which is a decode
    q = np.array([r[2] + min(r[3], r[2] - 1) for r in batch])
    k = np.array([min(r[3], r[2] - 1) for r in batch])
    prefilling = nc < prefill_len
    mine = runs_as_decode(prefilling, q, k, nc)
    theirs = []
    for i in range(len(batch)):
        still_prompt = int(nc[i]) < int(prefill_len[i])
        new_prompt_tokens = int(q[i]) - int(k[i])
        has_context = int(nc[i]) != 0
        theirs.append(still_prompt and new_prompt_tokens == 1 and has_context)
    assert mine.tolist() == theirs
    eligible = all((not p) or d for p, d in zip(prefilling.tolist(), theirs))
    assert decode_graph_eligible(prefilling, mine) is eligible
    assert decode_graph_eligible(prefilling, None) is (not any(prefilling.tolist()))


def _stage(q, drafts, local_pos):
    cu = [0]
    for n in drafts:
        cu.append(cu[-1] + 1 + n)

    def arr(v, dtype):
        a = np.asarray(v, dtype=dtype)
        return FieldObs("numpy", a.dtype.name, a.shape, a)
    return StageObs(stage="prepare", fields={
        "num_scheduled_tokens": arr(q, np.int32), "num_draft_tokens_per_req": arr(drafts, np.int32),
        "num_draft_tokens": FieldObs("scalar", "int", (), int(sum(drafts))),
        "cu_num_logits": arr(cu, np.int32), "expanded_local_pos": arr(local_pos, np.int32)})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.data())
def test_expanded_local_pos_relation_agrees_with_its_comment(drafts, data):
    """"[total_num_logits] position within request for each logit": written as a counter
    that restarts at every request."""
    q = [1 + n for n in drafts]
    want = []
    for n in drafts:
        want.extend(range(1 + n))
    assert check_batch_semantics(0, _stage(q, drafts, want)) == []
    if len(want) > 1:  # any other sequence of the same length breaks the relation
        other = data.draw(st.lists(st.integers(0, 4), min_size=len(want), max_size=len(want)))
        found = check_batch_semantics(0, _stage(q, drafts, other))
        assert bool([f for f in found if f.field == "expanded_local_pos"]) is (other != want)


def _chunk_picture_rows(p: int, dcp: int, shard: bool, q: list[int], prefilling: list[bool]):
    """PCP rows restated chunk by chunk, as the _iter_rank_chunks docstring draws them
    ("rank 0: 0 ... 7", "rank 3: 3 4"): rank r takes chunk r, then chunk 2P-1-r, each
    [c * size, (c + 1) * size) cut to the query; a decode (or, with DCP, a prefill that
    leaves a chunk empty) is taken whole by every rank, or by one owner in turn; then
    the rank's rows are stably moved decodes-first."""
    n_chunks = 2 * p
    ranks: list[list[tuple[bool, tuple[int, int, int]]]] = [[] for _ in range(p)]
    turn = 0
    for g, (n, pre) in enumerate(zip(q, prefilling)):
        if n == 0:
            continue
        size = (n + n_chunks - 1) // n_chunks
        some_chunk_empty = sum(1 for c in range(n_chunks) if c * size < n) < n_chunks
        if not pre or (dcp > 1 and some_chunk_empty):
            if shard and not pre:
                ranks[turn % p].append((pre, (g, 0, n)))
                turn += 1
            else:
                for rank in range(p):
                    ranks[rank].append((pre, (g, 0, n)))
            continue
        for rank in range(p):
            for c in (rank, n_chunks - 1 - rank):
                lo, hi = c * size, min((c + 1) * size, n)
                if hi > lo:
                    ranks[rank].append((pre, (g, lo, hi - lo)))
    return [[row for _, row in sorted(rows, key=lambda item: item[0])] for rows in ranks]


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 4), st.sampled_from([(1, False), (1, True), (2, False), (4, False)]),
       st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=8))
def test_pcp_layout_agrees_with_the_chunk_picture(p, dcp_shard, batch):
    """pcp_layout's token-by-token DualChunkSwap against the chunk-by-chunk picture."""
    from simrig.partition.pcp_layout import dispatch_token_count, rank_rows
    from simrig.step import RunnerConfig

    dcp, shard = dcp_shard
    config = RunnerConfig(pcp_size=p, dcp_size=dcp if p > 1 else 1, shard_decode_requests=shard and p > 1)
    q = [n for n, _ in batch]
    pre = [pf for _, pf in batch]
    theirs = _chunk_picture_rows(p, config.dcp_size, config.shard_decode_requests, q, pre)
    assert rank_rows(config, np.array(q), np.array(pre)) == theirs
    assert dispatch_token_count(config, np.array(q), np.array(pre)) == max(
        sum(n for _, _, n in rows) for rows in theirs)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 96), min_size=1, max_size=6, unique=True), st.integers(1, 16),
       st.integers(1, 4))
def test_uniform_graphs_agree_with_rounding_each_capture_size(sizes, max_reqs, u):
    """Uniform decode graphs, per request count in captured_graphs, against rounding every
    capture size up to whole requests of u tokens and dropping what exceeds the limits."""
    from simrig.graph_rules.padding import captured_graphs
    from simrig.step import RunnerConfig

    config = RunnerConfig(cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=tuple(sorted(sizes)),
                          max_num_reqs=max_reqs)
    rounded = {-(-s // u) * u for s in sizes}
    theirs = sorted((t, t // u) for t in rounded if t <= max(sizes) and t // u <= max_reqs)
    assert captured_graphs(config, "uniform", u) == theirs
