#!/usr/bin/env python3
"""Generate a long, churny, valid trace (for memory and throughput runs).

    python scripts/gen_long_trace.py --steps 100000 --out /tmp/long.jsonl.gz

A small scheduler model, written from the scheduler's contract (not vLLM's
code): every step it finishes requests that reached max_tokens, sometimes
preempts one (it comes back later as a new request carrying all its tokens),
schedules decodes (1 + drafts, some drafts rejected), continues chunked
prefills under the token budget and admits new requests while slots remain.

    per request: prompt_len, all_len (prompt + outputs), computed, max_tokens
    prefill while computed < prefill_len; decode: computed == all_len - 1
    after a step: computed += scheduled - rejected; outputs grow by what was sampled
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step  # noqa: E402
from simrig.trace_io.trace import TraceHeader, TraceWriter  # noqa: E402


@dataclass
class Req:
    req_id: str
    prompt_len: int
    max_tokens: int
    prefill_len: int  # tokens handed to the runner when (re)added
    all_len: int  # prompt + outputs so far
    computed: int = 0
    outputs: int = 0


def _schedule(req: Req, step: Step, budget: int, config: RunnerConfig,
              rng: random.Random) -> int:
    """Schedule one request within the budget; returns the tokens used."""
    if req.computed < req.prefill_len:
        n = min(req.prefill_len - req.computed, budget)
    else:
        k = max(min(config.num_speculative_tokens, budget - 1,
                    config.max_model_len - req.all_len - 1), 0)
        n = 1 + k
        if k:
            step.spec_tokens[req.req_id] = k
            rejected = rng.randint(0, k)
            if rejected:
                step.rejected[req.req_id] = rejected
    step.num_scheduled_tokens[req.req_id] = n
    return n


def generate(num_steps: int, seed: int, config: RunnerConfig, preempt_p: float,
             max_tokens: tuple[int, int] = (1, 64)):
    rng = random.Random(seed)
    running: list[Req] = []
    waiting: list[Req] = []  # preempted, to be resumed
    next_id = 0
    finished_next: list[str] = []
    for _ in range(num_steps):
        step = Step(finished=finished_next)
        finished_next = []
        if running and rng.random() < preempt_p:
            victim = running.pop(rng.randrange(len(running)))
            step.preempted.append(victim.req_id)
            victim.prefill_len, victim.computed = victim.all_len, 0
            waiting.append(victim)
        budget = config.max_num_batched_tokens
        # Running requests first (decodes and continuing chunked prefills);
        # only scheduled ones appear in cached_requests, as in vLLM.
        for req in running:
            if budget <= 0:
                break
            step.cached.append(CachedUpdate(req.req_id, req.computed))
            budget -= _schedule(req, step, budget, config, rng)
        # Then admit: resumed requests first, then fresh ones, while slots and budget remain.
        while len(running) < config.max_num_reqs and budget > 0 and (waiting or rng.random() < 0.6):
            if waiting:
                req = waiting.pop(0)
                req.computed = rng.choice([0, (req.prefill_len - 1) // config.block_size
                                           * config.block_size])
            else:
                prompt = rng.randint(1, 200)
                req = Req(f"req-{next_id}", prompt, rng.randint(*max_tokens), prompt, prompt)
                next_id += 1
            running.append(req)
            step.new_requests.append(NewRequest(
                req.req_id, req.prompt_len, num_computed_tokens=req.computed,
                max_tokens=req.max_tokens,
                prefill_len=req.prefill_len if req.prefill_len != req.prompt_len else None))
            budget -= _schedule(req, step, budget, config, rng)
        yield step
        # The sampler's outcome, as the scheduler applies it.
        for req in list(running):
            n = step.num_scheduled_tokens.get(req.req_id, 0)
            if not n:
                continue
            was_prefill = req.computed < req.prefill_len
            accepted = n - step.rejected.get(req.req_id, 0)
            req.computed += accepted
            if was_prefill:
                sampled = 1 if req.computed >= req.prefill_len else 0
            else:
                sampled = accepted
            req.outputs += sampled
            req.all_len += sampled
            if req.outputs >= req.max_tokens or req.all_len >= config.max_model_len - 1:
                running.remove(req)
                finished_next.append(req.req_id)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spec", type=int, default=2, help="num_speculative_tokens")
    ap.add_argument("--preempt", type=float, default=0.02, help="preemption probability per step")
    ap.add_argument("--max-tokens", default="1,64", metavar="LO,HI",
                    help="output length range; long outputs mean fewer admissions, and on CPU "
                         "each admission costs ~0.1 s (add_requests' staged writes run in the "
                         "Triton interpreter)")
    ap.add_argument("--out", required=True, help="*.jsonl, *.jsonl.gz or *.jsonl.zst")
    args = ap.parse_args()
    lo, hi = (int(v) for v in args.max_tokens.split(","))
    config = RunnerConfig(max_num_reqs=16, max_num_batched_tokens=256, max_model_len=4096,
                          num_speculative_tokens=args.spec)
    header = TraceHeader(config=config, source={
        "kind": "generated", "generator": "scripts/gen_long_trace.py", "seed": args.seed,
        "steps": args.steps})
    with TraceWriter(args.out, header) as writer:
        for step in generate(args.steps, args.seed, config, args.preempt, (lo, hi)):
            writer.write(step)
    print(f"{args.out}: {writer.num_steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
