"""libdevice's ``log1p`` and ``isnan`` in Triton's interpreter (``answer_libdevice``,
simrig/triton_libdevice/libdevice.py): a kernel calling them runs, with the
functions' meanings, where Triton's interpreter alone hands back None."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("no Triton", allow_module_level=True)

kernel = torch = None  # set by _triton, once the platform is chosen


@pytest.fixture(autouse=True, scope="module")
def _triton():
    global kernel, torch
    from simrig.triton_interpreter import registry
    from simrig.vllm_runtime import interpreter_patches, platform

    if not platform.configure().is_cpu:
        pytest.skip("CUDA mode: libdevice is the device's own")
    # this patch alone, as CPU mode installs it: never memcheck or the rest of the catalogue,
    # which a later test in this process must find as its own run leaves them
    registry.apply(interpreter_patches.libdevice_patch())
    import torch as torch_module
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice  # noqa: F401  (tl.extra.libdevice below)

    @triton.jit
    def gumbel_like(u_ptr, noise_ptr, nan_ptr, N: tl.constexpr):
        # the form of a Gumbel draw from a uniform u: -log(-log1p(-u))
        offs = tl.arange(0, N)
        u = tl.load(u_ptr + offs)
        tl.store(noise_ptr + offs, -tl.log(-tl.extra.libdevice.log1p(-u)))
        tl.store(nan_ptr + offs, tl.extra.libdevice.isnan(u).to(tl.int8))

    kernel, torch = gumbel_like, torch_module


def _run(values: list[float]) -> tuple[np.ndarray, list[bool]]:
    n = 8
    u = torch.full((n,), 0.5, dtype=torch.float32)
    u[: len(values)] = torch.tensor(values, dtype=torch.float32)
    noise, nans = torch.zeros(n, dtype=torch.float32), torch.zeros(n, dtype=torch.int8)
    kernel[(1,)](u, noise, nans, N=n)
    return noise[: len(values)].numpy(), [bool(v) for v in nans[: len(values)].tolist()]


def test_the_patch_is_installed_in_cpu_mode():
    from simrig.triton_interpreter import registry

    state = {s.name: s for s in registry.patch_states()}["answer_libdevice"]
    assert state.state == registry.INSTALLED, state.line()


def test_log1p_keeps_the_tail_log_of_one_plus_loses():
    # u = 4.66e-10 is Triton's smallest tl.rand draw: log(1 - u) is 0 in float32 (the noise
    # would be inf), log1p(-u) is -u
    noise, _ = _run([4.6566127342e-10, 0.5, 0.999])
    assert np.isfinite(noise).all()
    assert noise[0] == pytest.approx(-np.log(4.6566127342e-10), rel=1e-6)  # 21.49...
    assert noise[1] == pytest.approx(0.366512920581664, rel=1e-6)  # -log(log 2)
    assert noise[2] == pytest.approx(-1.9326, abs=1e-3)  # -log(-log(0.001))
    assert noise.dtype == np.float32


def test_log1p_agrees_with_torch_within_one_ulp():
    # torch's log1p is an implementation of its own; CUDA's log1pf is within 1 ulp as well
    values = [-0.75, -1e-7, 0.0, 3e-10, 0.25, 0.9]
    n = 8
    x = torch.zeros(n, dtype=torch.float32)
    x[: len(values)] = torch.tensor(values, dtype=torch.float32)
    import triton
    import triton.language as tl

    @triton.jit
    def plain(src, dst, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(dst + offs, tl.extra.libdevice.log1p(tl.load(src + offs)))

    out = torch.full((n,), -7.0, dtype=torch.float32)
    plain[(1,)](x, out, N=n)
    np.testing.assert_array_max_ulp(out.numpy(), torch.log1p(x).numpy(), maxulp=1)
    assert out[3].item() != 0.0  # log(1 + 3e-10) would be 0 in float32


def test_isnan_is_a_predicate():
    _, nans = _run([float("nan"), 0.25, float("inf"), float("nan")])
    assert nans == [True, False, False, True]


def test_libdevice_runs_names_only_what_the_interpreter_answers():
    from simrig.vllm_runtime import platform

    assert platform.libdevice_runs({"log1p"})
    assert platform.libdevice_runs({"log1p", "isnan"})
    assert not platform.libdevice_runs({"log1p", "erfcinv"})


def test_the_probe_holds_the_kernel_to_numpys_meaning():
    from simrig.triton_libdevice import libdevice as interpreter_libdevice

    answer = interpreter_libdevice.probe()  # installed: through a kernel
    x = np.array(interpreter_libdevice.PROBE_VALUES, dtype=np.float32)
    assert answer == [np.log1p(x).tobytes().hex(), [False] * 5 + [True]]
