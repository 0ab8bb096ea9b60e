"""A forked worker after a parallel torch op in its parent: GNU OpenMP's thread pool does not
survive a fork, so a worker that enters a parallel region blocks for ever. A test process
(an xdist worker) that ran a large torch op and then forks a supervised campaign is exactly
that parent; ``lifeline.in_forked_child`` turns intra-op parallelism off in the child."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm  # supervise() loads the vLLM adapter before it forks


def test_a_forked_worker_runs_a_large_torch_op_after_a_parallel_region_in_its_parent(tmp_path):
    import torch

    from simrig.supervision.forked import supervise

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the parent's pool, as on any machine with two cores or more
    try:
        torch.full((64, 65_536), 1.0).sum()  # a parallel region in the parent: the pool starts

        def work(state_dir, last, elapsed_before):
            return int(torch.full((64, 65_536), float("-inf")).isinf().all()) - 1  # 0 when it ran

        crashes = []
        status = supervise("fork-threads", tmp_path / "out", work,
                           lambda state_dir, reading, what: crashes.append(what) or what,
                           timeout_s=20, max_crashes=1)
    finally:
        torch.set_num_threads(threads)
    assert (status, crashes) == (0, [])
