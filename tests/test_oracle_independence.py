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
from simrig.checks.semantics import check_batch_semantics
from simrig.observe import FieldObs, StageObs

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
        for j in range(1 + n):
            want.append(j)
    assert check_batch_semantics(0, _stage(q, drafts, want)) == []
    if len(want) > 1:  # any other sequence of the same length breaks the relation
        other = data.draw(st.lists(st.integers(0, 4), min_size=len(want), max_size=len(want)))
        found = check_batch_semantics(0, _stage(q, drafts, other))
        assert bool([f for f in found if f.field == "expanded_local_pos"]) is (other != want)
