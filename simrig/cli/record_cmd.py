"""``simrig record``: drive vLLM's real scheduler with a workload, write a trace."""

from __future__ import annotations

import argparse
import time

from simrig.errors import UsageError


def add_scheduler_options(p: argparse.ArgumentParser, *, max_model_len: int, max_num_seqs: int = 16,
                          max_num_batched_tokens: int = 256, num_kv_blocks: int = 256) -> None:
    """Output and scheduler knobs shared by ``record`` and ``import``."""
    p.add_argument("--out", required=True, metavar="TRACE", help="output trace (.jsonl[.gz|.zst])")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="stop after N steps (default: until the workload drains)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the load; default 1)")
    g = p.add_argument_group("scheduler")
    g.add_argument("--max-num-seqs", type=int, default=max_num_seqs,
                   help=f"running requests (default {max_num_seqs})")
    g.add_argument("--max-num-batched-tokens", type=int, default=max_num_batched_tokens,
                   help=f"token budget per step (default {max_num_batched_tokens})")
    g.add_argument("--max-model-len", type=int, default=max_model_len,
                   help=f"model length; longer requests are clamped (default {max_model_len})")
    g.add_argument("--num-kv-blocks", type=int, default=num_kv_blocks,
                   help=f"KV cache blocks of 16 tokens; small values force preemption (default {num_kv_blocks})")
    g.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM prefix caching (default on)")
    g.add_argument("--num-speculative-tokens", type=int, default=0,
                   help="drafts per request per step (ngram config; default 0 = off)")
    g.add_argument("--acceptance-rate", type=float, default=0.7,
                   help="per-draft acceptance probability of the synthetic sampler (default 0.7)")
    g.add_argument("--eos-prob", type=float, default=0.0,
                   help="per-token probability that the synthetic sampler stops a request (default 0)")
    g.add_argument("--seed", type=int, default=0, help="sampler (and synthetic workload) seed")
    g.add_argument("--pcp-size", type=int, default=1,
                   help="prefill context parallel size of the config and the replay (default 1)")
    g.add_argument("--max-loras", type=int, default=0,
                   help="LoRA on, at most N adapters per batch: each request runs the base model or "
                        "one of 2N adapters, drawn with --seed (default 0 = off)")


def setup_from_args(args: argparse.Namespace):
    """Validate the shared options; the scheduler setup they describe."""
    from simrig.vllm_parts.scheduler import SchedulerSetup

    check_out(args.out)
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps: must be >= 1, got {args.steps}")
    if args.time_scale <= 0:
        raise UsageError(f"--time-scale: must be > 0, got {args.time_scale}")
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_kv_blocks", "pcp_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.max_loras < 0:
        raise UsageError(f"--max-loras: must be >= 0, got {args.max_loras}")
    if args.num_speculative_tokens < 0:
        raise UsageError(f"--num-speculative-tokens: must be >= 0, got {args.num_speculative_tokens}")
    for name in ("acceptance_rate", "eos_prob"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise UsageError(f"--{name.replace('_', '-')}: must be in [0, 1], got {getattr(args, name)}")
    return SchedulerSetup(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, num_kv_blocks=args.num_kv_blocks,
        prefix_caching=args.prefix_caching, num_speculative_tokens=args.num_speculative_tokens,
        pcp_size=args.pcp_size, max_loras=args.max_loras)


def check_out(path: str) -> None:
    """The output trace: a trace name, in a folder that can be written (checked before the run)."""
    from simrig.report.writer import check_out_file

    if not path.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
        raise UsageError(f"--out: {path}: expected a .jsonl, .jsonl.gz or .jsonl.zst name")
    check_out_file(path)


def print_summary(path: str, result, wall_s: float, clamped: int = 0) -> None:
    s = result.stats
    print(f"wrote {path}: {s.steps} steps, {s.requests} requests "
          f"({result.requests_admitted}/{result.requests_total} admitted, {s.finished} finished)")
    print(f"  preemptions {s.preemptions}, resumptions {s.resumptions}, "
          f"chunked-prefill steps {s.chunked_prefill_steps}, spec-decode steps {s.spec_decode_steps} "
          f"({s.draft_tokens} drafts, {s.rejected_tokens} rejected)")
    print(f"  prefix-cache hits {s.prefix_cache_hits} ({s.prefix_cache_hit_tokens} tokens), "
          f"max batch {s.max_batch_reqs} requests, {s.scheduled_tokens} tokens scheduled"
          + (f", {clamped} requests clamped to --max-model-len" if clamped else ""))
    print(f"  simulated {result.simulated_s:.1f} s; wall {wall_s:.1f} s (scheduler setup {result.setup_s:.1f} s), "
          f"scheduler loop {result.scheduler_s:.2f} s ({s.steps / max(result.scheduler_s, 1e-9):.0f} steps/s)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "record", help="record a trace from vLLM's real scheduler",
        description="Drive vLLM's real v1 Scheduler (offline, CPU) with a workload and a synthetic "
                    "sampler; write every SchedulerOutput as a trace step. SPEC: "
                    "synthetic:requests=N,rate=R,prompt=LO-HI,output=LO-HI,shared_prefix=F "
                    "(also prefixes, prefix_len, seed), or azure:PATH, burstgpt:PATH, mooncake:PATH.")
    p.add_argument("--workload", required=True, metavar="SPEC", help="workload SPEC")
    add_scheduler_options(p, max_model_len=2048)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simrig.sources import workloads
    from simrig.sources.record import record_to_file

    setup = setup_from_args(args)
    reqs = workloads.parse_spec(args.workload)
    clamped = workloads.clamp(reqs, setup.max_model_len)
    start = time.perf_counter()
    result = record_to_file(args.out, setup, reqs, spec=args.workload, seed=args.seed,
                            acceptance_rate=args.acceptance_rate, eos_prob=args.eos_prob,
                            max_steps=args.steps, time_scale=args.time_scale)
    print_summary(args.out, result, time.perf_counter() - start, clamped)
    return 0
