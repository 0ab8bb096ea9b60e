"""Seeds, checked without a model of vLLM's random numbers: a request with an explicit seed
gets the same tokens whatever its slot, its batch neighbours, the PCP size, the graph mode
or a preemption. The same requests replay under two schedules and their tokens are
compared position by position (a metamorphic check; each replay is also judged by the
oracle). vLLM's Gumbel noise is keyed by the request's seed and the token's position
(``gumbel_sample``: "``pos`` and ``seed`` place the draw in the request's stream")."""

from __future__ import annotations

import dataclasses

import pytest

from simrig import observe as obs
from simrig.harness import Harness
from simrig.replay import replay_problems
from simrig.sampling.params import SamplingSpec
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceHeader

pytestmark = pytest.mark.vllm

SEEDED = {"a": SamplingSpec(temperature=1.2, seed=11), "b": SamplingSpec(top_k=50, seed=-7),
          "c": SamplingSpec(top_p=0.9, presence_penalty=0.5, seed=2**40)}
PROMPT, DECODES = 9, 5


def together() -> list[Step]:
    """a, b, c admitted at once in slots 0-2, then decoding side by side."""
    ids = list(SEEDED)
    steps = [Step(new_requests=[NewRequest(r, PROMPT, sampling=SEEDED[r], block_ids=[i]) for i, r in enumerate(ids)],
                  num_scheduled_tokens={r: PROMPT for r in ids})]
    return steps + [Step(cached=[CachedUpdate(r, PROMPT + s) for r in ids], num_scheduled_tokens={r: 1 for r in ids})
                    for s in range(DECODES)]


def shuffled() -> list[Step]:
    """An unseeded neighbour first (it takes slot 0), c then a, b a step later with its
    prompt in two chunks; a is preempted after two decodes and resumed with its outputs."""
    x = NewRequest("x", 5, sampling=SamplingSpec(temperature=0.9), block_ids=[9])
    new = lambda r, slot: NewRequest(r, PROMPT, sampling=SEEDED[r], block_ids=[slot])  # noqa: E731
    steps = [Step(new_requests=[x, new("c", 3), new("a", 4)], num_scheduled_tokens={"x": 5, "c": PROMPT, "a": PROMPT}),
             Step(new_requests=[new("b", 5)], cached=[CachedUpdate("x", 5), CachedUpdate("c", PROMPT),
                                                        CachedUpdate("a", PROMPT)],
                  num_scheduled_tokens={"b": 4, "x": 1, "c": 1, "a": 1}),
             Step(cached=[CachedUpdate("b", 4), CachedUpdate("c", PROMPT + 1), CachedUpdate("a", PROMPT + 1)],
                  num_scheduled_tokens={"b": PROMPT - 4, "c": 1, "a": 1}, finished=["x"]),
             Step(preempted=["a"], cached=[CachedUpdate("b", PROMPT), CachedUpdate("c", PROMPT + 2)],
                  num_scheduled_tokens={"b": 1, "c": 1})]
    # a was given 3 tokens: it re-sends them all and computes them again
    resumed = dataclasses.replace(new("a", 6), num_computed_tokens=0, prefill_len=PROMPT + 3)
    steps.append(Step(new_requests=[resumed], cached=[CachedUpdate("b", PROMPT + 1), CachedUpdate("c", PROMPT + 3)],
                      num_scheduled_tokens={"a": PROMPT + 3, "b": 1, "c": 1}))
    for s in range(3):
        steps.append(Step(cached=[CachedUpdate("a", PROMPT + 3 + s), CachedUpdate("b", PROMPT + 2 + s),
                                  CachedUpdate("c", PROMPT + 4 + s)], num_scheduled_tokens={"a": 1, "b": 1, "c": 1}))
    return steps


def tokens(config: RunnerConfig, steps: list[Step], api) -> dict[str, list[int]]:
    harness, out = Harness(config, api=api), {}
    for step in steps:
        post = harness.run_step(step).get(obs.POSTPROCESS).fields
        for req_id, got in zip(post["output.req_ids"].values, post["output.sampled_token_ids"].values):
            out.setdefault(req_id, []).extend(got)
    return {r: out[r][:DECODES] for r in SEEDED}


@pytest.mark.parametrize("config", [
    RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=64),
    RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=64, pcp_size=2),
    RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=64, cudagraph_mode="FULL_AND_PIECEWISE",
                 capture_sizes=(1, 2, 4, 8)),
], ids=["plain", "pcp2", "graphs"])
def test_a_seeded_request_gets_the_same_tokens_under_another_schedule(vllm_api, config):
    base = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=64)
    want = tokens(base, together(), vllm_api)
    assert all(len(t) == DECODES for t in want.values())
    assert replay_problems(TraceHeader(config=config), shuffled(), api=vllm_api) == []
    assert tokens(config, shuffled(), vllm_api) == want


def test_a_seed_taken_from_the_slot_breaks_the_promise(vllm_api, seed_keyed_by_slot):
    """A seeded fault: each request's random stream keyed by its slot, not its seed. The
    oracle cannot see it (every token stays inside its support); the metamorphic check does,
    here and as the replay's seeds check (each seeded request replayed alone: seeds.py)."""
    seed_keyed_by_slot()
    config = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=64)
    problems = replay_problems(TraceHeader(config=config), shuffled(), api=vllm_api)
    assert problems and all("sampler.seeded_tokens" in p for p in problems), problems
    assert tokens(config, shuffled(), vllm_api) != tokens(config, together(), vllm_api)
