"""Fixtures shared by the pytest-benchmark suites (run by ``simrig bench``).

The micro suites need only numpy / torch; the stage suites load the real
installed vLLM once per session through ``tests/conftest.py``'s ``vllm_api``
fixture (the import costs ~15 s on CPU), lazily, so
``-k`` selections of micro benchmarks never pay for it.

The replayed trace is the first non-adversarial ``traces/samples/*.jsonl``
when one is bundled, else ``builtin_steps()``: a small step sequence with a
prefill wave, a chunked prefill, decodes and finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "traces" / "samples"
# Steps replayed per round: bounds one round's cost on CPU, where
# prepare_inputs costs ~20 ms + ~1.75 ms per request (Triton interpreter).
MAX_STEPS = 12


@dataclass(frozen=True)
class BenchTrace:
    name: str  # file name, or "builtin"
    config: RunnerConfig
    steps: list[Step]

    @property
    def max_reqs(self) -> int:
        return max((len(s.num_scheduled_tokens) for s in self.steps), default=0)

    @property
    def total_tokens(self) -> int:
        return sum(s.total_num_scheduled_tokens for s in self.steps)

    def with_pcp(self, pcp_size: int) -> BenchTrace:
        return replace(self, config=replace(self.config, pcp_size=pcp_size))


def builtin_steps(num_reqs: int = 8) -> tuple[RunnerConfig, list[Step]]:
    """A valid scheduler-like sequence for ``num_reqs`` requests.

        step 0   prefill r0..r{n-1} (the last one chunked: budget)
        step 1   decodes + the rest of the chunked prefill
        step 2-4 decodes
        step 5   r0 finishes, the others decode
    """
    config = RunnerConfig(max_num_reqs=16, max_num_batched_tokens=512, max_model_len=1024)
    ids = [f"r{i}" for i in range(num_reqs)]
    prompts = {r: 16 + 8 * i for i, r in enumerate(ids)}
    last = ids[-1]
    first_chunk = prompts[last] // 2
    sched0 = {r: prompts[r] for r in ids}
    sched0[last] = first_chunk
    steps = [Step(new_requests=[NewRequest(r, prompts[r], max_tokens=32) for r in ids],
                  num_scheduled_tokens=sched0)]
    computed = dict(sched0)
    sched1 = {r: 1 for r in ids}
    sched1[last] = prompts[last] - first_chunk
    steps.append(Step(cached=[CachedUpdate(r, computed[r]) for r in ids],
                      num_scheduled_tokens=sched1))
    for r in ids:
        computed[r] += sched1[r]
    live = list(ids)
    for k in range(2, 6):
        finished = [live.pop(0)] if k == 5 else []
        steps.append(Step(cached=[CachedUpdate(r, computed[r]) for r in live],
                          num_scheduled_tokens={r: 1 for r in live}, finished=finished))
        for r in live:
            computed[r] += 1
    return config, steps


def load_bench_trace() -> BenchTrace:
    from simrig.trace_io.trace import read_trace

    for path in sorted(SAMPLES.glob("*.jsonl")) if SAMPLES.is_dir() else []:
        header, steps = read_trace(path)
        if not header.adversarial and steps:
            return BenchTrace(path.name, header.config, steps[:MAX_STEPS])
    config, steps = builtin_steps()
    return BenchTrace("builtin", config, steps)


@pytest.fixture(scope="session")
def bench_trace() -> BenchTrace:
    return load_bench_trace()


@pytest.fixture(scope="session")
def torch_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
