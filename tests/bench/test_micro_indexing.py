"""Micro: index dtypes on the MRV2 input path (int32 vs intp / int64).

The runner keeps per-request state in slot-indexed tables and reads it with
an index array (``idx_mapping``):

    table [max_num_reqs]        idx [num_reqs]         out [num_reqs]
    | a | b | c | d | ...  [2, 0, 3]  ------------>  | c | a | d |

These benchmarks measure whether the index dtype matters for NumPy fancy
indexing, ``torch.index_select`` / ``torch.gather``, and the host-to-device
copy of the index array itself (a no-op device on CPU: the copy is a host
memcpy; on CUDA it is a real transfer, synchronised before timing ends).
Pure NumPy / torch: no vLLM import.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.bench

SIZES = (256, 4096)
TABLE = 1 << 16  # slots in the indexed table
NP_DTYPES = {"int32": np.int32, "intp": np.intp}
TORCH_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def _index(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, TABLE, size=n)


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("n", SIZES, ids=[f"n{n}" for n in SIZES])
def test_numpy_fancy_index(benchmark, n: int, dtype: str) -> None:
    table = np.arange(TABLE, dtype=np.int32) * 3
    idx = _index(n).astype(NP_DTYPES[dtype])
    benchmark.group = f"numpy fancy index n={n}"
    benchmark.extra_info.update({"n": n, "index_dtype": idx.dtype.name,
                                 "table_dtype": "int32", "table_len": TABLE})
    out = benchmark(table.__getitem__, idx)
    np.testing.assert_array_equal(out, idx.astype(np.int64) * 3)


@pytest.mark.parametrize("op", ["index_select", "gather"])
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("n", SIZES, ids=[f"n{n}" for n in SIZES])
def test_torch_index(benchmark, torch_device: str, n: int, dtype: str, op: str) -> None:
    table = torch.arange(TABLE, dtype=torch.int32, device=torch_device) * 3
    idx = torch.from_numpy(_index(n)).to(device=torch_device, dtype=TORCH_DTYPES[dtype])
    fn = torch.index_select if op == "index_select" else torch.gather

    def call() -> torch.Tensor:
        out = fn(table, 0, idx)
        if torch_device == "cuda":
            torch.cuda.synchronize()
        return out

    benchmark.group = f"torch {op} n={n}"
    benchmark.extra_info.update({"n": n, "index_dtype": dtype, "op": op,
                                 "table_dtype": "int32", "device": torch_device})
    out = benchmark(call)
    assert torch.equal(out.cpu(), idx.cpu().to(torch.int32) * 3)


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("n", SIZES, ids=[f"n{n}" for n in SIZES])
def test_index_to_device(benchmark, torch_device: str, n: int, dtype: str) -> None:
    idx = _index(n).astype(NP_DTYPES[dtype])

    def copy() -> torch.Tensor:
        # copy=True: on CPU .to() would otherwise alias the NumPy buffer.
        out = torch.from_numpy(idx).to(torch_device, copy=True)
        if torch_device == "cuda":
            torch.cuda.synchronize()
        return out

    benchmark.group = f"index host-to-device n={n}"
    benchmark.extra_info.update({"n": n, "index_dtype": idx.dtype.name,
                                 "bytes": int(idx.nbytes), "device": torch_device})
    out = benchmark(copy)
    assert out.device.type == torch_device
    assert np.array_equal(out.cpu().numpy(), idx)
