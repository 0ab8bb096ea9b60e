"""Seeded temperature > 0 requests spread under speculative decoding, outside the rig's rule
(which keeps them one-hot, docs/sampling.md 'Under speculative decoding'): vLLM's own
RejectionSampler decides acceptance, and this prints each request's tokens at one
verification step, to compare releases (the `spec_step_seed` and bonus-row evidence in
docs/known-findings.md). Eight requests, seeds 100-107, prompt 10; r0-r4 two argmax drafts,
r5-r7 one (fewer than K = 2).

    python scripts/spec_seed_probe.py standard|block TEMPERATURE
    .venvs/vllm-0.32.0/bin/python scripts/spec_seed_probe.py block 0.3
"""

import sys

import simrig.vllm_sampling.feed as feed
from simrig.observe import handed_to_scheduler
from simrig.sampling.params import SamplingSpec
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step

method, temperature = sys.argv[1], float(sys.argv[2])
# the probe's one change: every request with parameters is spread, whatever its temperature
feed.spreads = lambda spec, n, structured=False: spec is not None and not spec.is_default
from simrig.harness import Harness  # noqa: E402 -- after the patch, so the harness's feed reads it

config = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=128, num_speculative_tokens=2,
                      rejection_sampler=method)
ids = [f"r{i}" for i in range(8)]
drafts = {r: (2 if i < 5 else 1) for i, r in enumerate(ids)}
specs = {r: SamplingSpec(temperature=temperature, seed=100 + i) for i, r in enumerate(ids)}
steps = [Step(new_requests=[NewRequest(r, prompt_len=10, sampling=specs[r], block_ids=[i]) for i, r in enumerate(ids)],
              num_scheduled_tokens={r: 10 for r in ids}),
         Step(cached=[CachedUpdate(r, 10) for r in ids], num_scheduled_tokens={r: 1 + drafts[r] for r in ids},
              spec_tokens=drafts)]
harness = Harness(config)
for step in steps:
    result = harness.run_step(step)
    if result.errors:
        sys.exit(f"step {result.index}: {result.errors[0].error}")
    import vllm  # after the harness configured the platform (vLLM must load after it)

    got = handed_to_scheduler(result)
    print(f"vllm {vllm.__version__} {method} T={temperature} step {result.index}:",
          " ".join(f"{r}={got[r]}" for r in ids))
