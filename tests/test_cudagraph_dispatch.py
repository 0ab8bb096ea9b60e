"""vLLM's real cudagraph dispatch, built without a GPU (simrig.vllm_parts.cudagraph)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm


def test_full_and_piecewise_pads_decodes_and_mixed_batches(vllm_api):
    from simrig.vllm_parts.cudagraph import build_dispatcher

    m = build_dispatcher("FULL_AND_PIECEWISE", [1, 2, 4, 8, 16], max_num_reqs=8, decode_query_len=1)
    # 3 uniform decodes: the FULL decode graph for 4 tokens / 4 requests (padded by one row)
    d = m.dispatch(num_reqs=3, num_tokens=3, uniform_token_count=1, num_active_loras=0)
    assert (d.cg_mode.name, d.num_tokens, d.num_reqs, d.uniform_token_count) == ("FULL", 4, 4, 1)
    # a mixed batch of 5 tokens: the PIECEWISE graph for 8 tokens, no request padding
    d = m.dispatch(num_reqs=2, num_tokens=5, uniform_token_count=None, num_active_loras=0)
    assert (d.cg_mode.name, d.num_tokens, d.num_reqs) == ("PIECEWISE", 8, None)
    # past the largest capture size: eager, unpadded
    d = m.dispatch(num_reqs=2, num_tokens=17, uniform_token_count=None, num_active_loras=0)
    assert (d.cg_mode.name, d.num_tokens) == ("NONE", 17)


def test_spec_decode_rounds_to_whole_requests(vllm_api):
    from simrig.vllm_parts.cudagraph import build_dispatcher, capture_descriptors

    m = build_dispatcher("FULL_DECODE_ONLY", [1, 2, 4, 8], max_num_reqs=4, decode_query_len=3,
                         num_speculative_tokens=2)
    sizes = sorted({(d.num_tokens, d.num_reqs) for d in capture_descriptors(m)})
    assert all(t == 3 * r for t, r in sizes)  # uniform decode graphs hold whole 1+2-token queries
    d = m.dispatch(num_reqs=1, num_tokens=3, uniform_token_count=3, num_active_loras=0)
    assert (d.cg_mode.name, d.num_tokens, d.num_reqs) == ("FULL", 3, 1)
    # a prefill batch never takes the decode-only graph
    assert m.dispatch(num_reqs=1, num_tokens=3, uniform_token_count=None,
                      num_active_loras=0).cg_mode.name == "NONE"


def test_bad_mode_is_named(vllm_api):
    from simrig.vllm_parts.cudagraph import build_dispatcher

    with pytest.raises(ValueError, match="cudagraph mode: 'FAST'"):
        build_dispatcher("FAST", [1], max_num_reqs=1, decode_query_len=1)
