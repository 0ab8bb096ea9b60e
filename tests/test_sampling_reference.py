"""The sampling reference (simrig.sampling.processing) on rows small enough to compute by
hand: each parameter's meaning, pinned."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simrig.sampling.logits import spread_logits, spreads
from simrig.sampling.params import SamplingSpec
from simrig.sampling.processing import expected_row

ROW = np.array([2.0, 1.0, 0.0, -1.0, 3.0, -2.0], dtype=np.float32)
INF = -math.inf


def values(spec: SamplingSpec, prompt=(), outputs=()) -> list[float]:
    return [round(float(v), 6) for v in expected_row(spec, ROW, list(prompt), list(outputs)).values]


def test_defaults_leave_the_row_as_it_is():
    assert values(SamplingSpec()) == [2.0, 1.0, 0.0, -1.0, 3.0, -2.0]


def test_temperature_divides_and_zero_is_greedy_without_scaling():
    assert values(SamplingSpec(temperature=0.5)) == [4.0, 2.0, 0.0, -2.0, 6.0, -4.0]
    row = expected_row(SamplingSpec(temperature=0.0, top_k=1), ROW, [], [])
    assert row.greedy and list(row.values) == [2.0, 1.0, 0.0, -1.0, 3.0, -2.0]  # greedy ignores top-k
    assert values(SamplingSpec(temperature=0.001)) == [200.0, 100.0, 0.0, -100.0, 300.0, -200.0]


def test_logit_bias_adds_before_the_repetition_penalty_scales():
    # token 2: 0 + 1.5 = 1.5 > 0, seen in the prompt: / 2; token 3: -1 seen: * 2
    assert values(SamplingSpec(logit_bias=((2, 1.5),), repetition_penalty=2.0), prompt=[2, 3]) == \
        [2.0, 1.0, 0.75, -2.0, 3.0, -2.0]


def test_frequency_and_presence_count_only_the_outputs():
    # outputs: token 0 twice, token 4 once; the prompt's token 1 is not penalised
    assert values(SamplingSpec(frequency_penalty=0.5, presence_penalty=0.25), prompt=[1], outputs=[0, 4, 0]) == \
        [2.0 - 1.0 - 0.25, 1.0, 0.0, -1.0, 3.0 - 0.5 - 0.25, -2.0]


def test_min_tokens_masks_the_stop_ids_until_enough_are_out():
    spec = SamplingSpec(min_tokens=2, stop_token_ids=(4,))
    assert values(spec, outputs=[1])[4] == INF
    assert values(spec, outputs=[1, 2])[4] == 3.0


def test_a_bad_word_bans_its_last_token_only_after_its_prefix():
    spec = SamplingSpec(bad_words=((5,), (1, 4)))
    assert values(spec, prompt=[1], outputs=[0]) == [2.0, 1.0, 0.0, -1.0, 3.0, INF]
    assert values(spec, prompt=[0], outputs=[0, 1]) == [2.0, 1.0, 0.0, -1.0, INF, INF]


def test_min_p_top_k_and_top_p_cut_the_support():
    # min_p 0.3: keep logit >= 3 + ln 0.3 = 1.796
    assert values(SamplingSpec(min_p=0.3)) == [2.0, INF, INF, INF, 3.0, INF]
    assert values(SamplingSpec(top_k=3)) == [2.0, 1.0, INF, INF, 3.0, INF]
    # softmax: p(4) = 0.6439, p(0) = 0.2369: top_p 0.7 needs both, 0.6 only the first
    assert values(SamplingSpec(top_p=0.7)) == [2.0, INF, INF, INF, 3.0, INF]
    assert values(SamplingSpec(top_p=0.6)) == [INF, INF, INF, INF, 3.0, INF]


def test_a_token_on_the_top_k_cut_is_uncertain():
    row = np.array([1.0, 1.0, 0.0], dtype=np.float32)
    got = expected_row(SamplingSpec(top_k=1), row, [], [])
    assert got.uncertain.tolist() == [True, True, False]


def test_spread_rows_are_named_by_request_and_position_and_spread_only_with_parameters():
    a = spread_logits("req", 7, 4096)
    assert a.dtype == np.float32 and a.shape == (4096,) and np.isfinite(a).all()
    assert np.array_equal(a, spread_logits("req", 7, 4096))
    assert not np.array_equal(a, spread_logits("req", 8, 4096))
    assert 1.5 < float(a.std()) < 3.5
    assert spreads(SamplingSpec(top_k=5), 0) and not spreads(SamplingSpec(), 0)
    assert not spreads(None, 0) and not spreads(SamplingSpec(top_k=5), 2)


@pytest.mark.parametrize("top_p, low, high", [(0.5, 5, 200), (0.9, 100, 1500)])
def test_top_p_keeps_a_meaningful_part_of_a_spread_row(top_p, low, high):
    """SPREAD_SCALE's promise: top-p cuts neither to one token nor to the whole vocabulary."""
    for position in range(5):
        row = expected_row(SamplingSpec(top_p=top_p), spread_logits("a", position, 4096), [], [])
        assert low <= int(np.isfinite(row.values).sum()) <= high
