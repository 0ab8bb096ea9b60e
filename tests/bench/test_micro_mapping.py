"""Micro: building a request-index mapping from request ids.

MRV2's ``gather_batch_req_state`` turns the scheduled request ids into slot
indices with ``np.fromiter(map(req_id_to_index.__getitem__, ids),
dtype=np.intp)``. These benchmarks compare that idiom with its neighbours:

    ids ["r17", "r3", ...]  --dict lookup-->  [17, 3, ...]  --> np.intp array
         map(d.get, ids)         (None for an unknown id: fails later, far away)
         map(d.__getitem__, ids) (KeyError at the lookup: fails loudly)
         [d[i] for i in ids] into np.fromiter / np.array

Pure NumPy: no vLLM import.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.bench

SIZES = (8, 64, 256, 1024, 4096)


def _fromiter_get(d, ids, n):
    return np.fromiter(map(d.get, ids), dtype=np.intp, count=n)


def _fromiter_getitem(d, ids, n):
    return np.fromiter(map(d.__getitem__, ids), dtype=np.intp, count=n)


def _listcomp_fromiter(d, ids, n):
    return np.fromiter([d[i] for i in ids], dtype=np.intp, count=n)


def _listcomp_array(d, ids, n):
    return np.array([d[i] for i in ids], dtype=np.intp)


METHODS = {
    "get": _fromiter_get,
    "getitem": _fromiter_getitem,
    "listcomp_fromiter": _listcomp_fromiter,
    "listcomp_array": _listcomp_array,
}


def _case(n: int) -> tuple[dict[str, int], list[str], np.ndarray]:
    """n live requests in slots 0..2n-1 (half the slots free), scheduled in a
    shuffled order as the scheduler would hand them over."""
    rng = np.random.default_rng(n)
    slots = rng.permutation(2 * n)[:n]
    d = {f"req-{i:06d}": int(s) for i, s in enumerate(slots)}
    ids = list(d)
    order = rng.permutation(n)
    ids = [ids[k] for k in order]
    expected = np.array([d[i] for i in ids], dtype=np.intp)
    return d, ids, expected


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("n", SIZES, ids=[f"n{n}" for n in SIZES])
def test_mapping(benchmark, n: int, method: str) -> None:
    d, ids, expected = _case(n)
    fn = METHODS[method]
    benchmark.group = f"mapping n={n}"
    benchmark.extra_info.update({"n": n, "method": method, "dtype": np.dtype(np.intp).name})
    out = benchmark(fn, d, ids, n)
    assert out.dtype == np.intp
    np.testing.assert_array_equal(out, expected)
