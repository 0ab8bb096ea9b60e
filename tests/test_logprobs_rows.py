"""Which logprob rows a request gets, judged without vLLM (simrig/sampling_checks/logprobs.py):
under drafts the rows the scheduler slices for it (``cu_num_generated_tokens``), token j's
from the row it was sampled after; without, row i for request i."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from simrig.sampling.params import SamplingSpec
from simrig.sampling_checks.logprobs import check_logprobs
from simrig.step import synth_token

VOCAB = 4096
A_LAST, B_LAST = 12, 5  # a verifies two drafts (positions 10, 11, 12), b decodes one token


def _req(logprobs: int | None) -> SimpleNamespace:
    return SimpleNamespace(spec=SamplingSpec(logprobs=logprobs), spread=False)


REQS = {"a": _req(1), "b": _req(None)}
HANDED = {"a": [synth_token("a", 11), synth_token("a", 12), synth_token("a", 13)], "b": [synth_token("b", 6)]}


def _row(token: int) -> tuple[list[int], list[float], int]:
    """A one-hot row's logprobs: the token (logprob 0, rank 1), then it again as the top one."""
    return [token, token], [0.0, 0.0], 1


def _lists(rows: list[tuple[list[int], list[float], int]], cu: list[int] | None) -> SimpleNamespace:
    return SimpleNamespace(logprob_token_ids=np.array([r[0] for r in rows]),
                           logprobs=np.array([r[1] for r in rows], dtype=np.float32),
                           sampled_token_ranks=np.array([r[2] for r in rows]), cu_num_generated_tokens=cu)


def _check(lists: SimpleNamespace, drafts: dict[str, int]) -> list:
    seen = {"calls": [object()], "logprobs": lists}
    return check_logprobs(3, seen, REQS, {"a": A_LAST, "b": B_LAST}, HANDED, VOCAB, None, drafts)


def _spec_rows(bonus_after: int = A_LAST) -> list:
    # a's three logit rows (two kept drafts and the bonus), then b's one
    return [_row(synth_token("a", 11)), _row(synth_token("a", 12)), _row(synth_token("a", bonus_after + 1)),
            _row(synth_token("b", 6))]


def test_rows_the_scheduler_slices_are_judged_clean():
    assert _check(_lists(_spec_rows(), [0, 3, 4]), {"a": 2}) == []


def test_rows_sliced_by_batch_index_hand_b_one_of_as_rows():
    found = _check(_lists(_spec_rows(), [0, 1, 2]), {"a": 2})
    assert [(f.field, f.req_ids) for f in found] == [("output.logprobs", ("b",))]


def test_a_bonus_token_scored_in_another_row_is_found():
    found = _check(_lists(_spec_rows(bonus_after=A_LAST + 1), [0, 3, 4]), {"a": 2})
    assert [(f.field, f.req_ids) for f in found] == [("output.logprobs", ("a",))]


def test_too_few_rows_for_the_tokens_handed_out_is_found():
    found = _check(_lists(_spec_rows()[:3], [0, 3, 3]), {"a": 2})
    assert [f.req_ids for f in found] == [("b",)]


def test_without_drafts_request_i_reads_row_i():
    handed = {"b": [synth_token("b", 6)], "c": [synth_token("c", 9)]}
    reqs = {"b": _req(1), "c": _req(None)}
    rows = [_row(synth_token("b", 6)), _row(synth_token("c", 9))]
    seen = {"calls": [object()], "logprobs": _lists(rows, None)}
    assert check_logprobs(0, seen, reqs, {"b": 5, "c": 8}, handed, VOCAB) == []
    seen["logprobs"] = _lists(rows[::-1], None)
    assert [f.req_ids for f in check_logprobs(0, seen, reqs, {"b": 5, "c": 8}, handed, VOCAB)] == [("b", "c")]


def test_a_grammar_masks_the_rows_it_reached_and_no_other():
    """A spread request's grammar reached the runner: its row is judged masked (one allowed
    token: logprob 0, rank 1). A request with one-hot rows (SIMRIG_SAMPLER=stand-in) is
    handed no bitmask, so its row is judged unmasked, whatever the trace's set."""
    token = synth_token("b", 6)
    grammar = {"b": {(token + 1) % VOCAB}, "s": {7}}  # b's one-hot token lies outside its set
    reqs = {"b": _req(1), "s": SimpleNamespace(spec=SamplingSpec(logprobs=1), spread=True)}
    seen = {"calls": [object()], "logprobs": _lists([_row(token), _row(7)], None)}
    handed, last = {"b": [token], "s": [7]}, {"b": 5, "s": 9}
    assert check_logprobs(0, seen, reqs, last, handed, VOCAB, grammar) == []
    grammar["s"] = {7, 8}  # a second allowed token takes mass from 7: its logprob is below 0
    assert [f.req_ids for f in check_logprobs(0, seen, reqs, last, handed, VOCAB, grammar)] == [("s",)]
