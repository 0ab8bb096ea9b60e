"""``simrig import``: replay a public production workload through vLLM's real scheduler and write the
trace (``simrig.sources.workloads`` reads the file, ``simrig.sources.record`` records it)."""

from __future__ import annotations

import argparse

from simrig.cli.flags import add_scheduler_options, recorder_options
from simrig.errors import UsageError
from simrig.sources import workloads
from simrig.sources.record import record_and_print

DESCRIPTION = """Feed a production workload's arrivals and lengths through vLLM's real scheduler on
    a simulated clock (each step lasts 12 ms + 0.06 ms per scheduled token) and write the trace. Mooncake
    hash_ids become shared 512-token prefixes that hit vLLM's prefix cache. Requests are clamped to
    --max-model-len; --sampling-mix gives them production-like sampling parameters."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="turn a public workload (Azure, BurstGPT, Mooncake) into a trace",
                       description=DESCRIPTION)
    p.add_argument("--format", required=True, choices=("azure", "burstgpt", "mooncake"))
    p.add_argument("file", metavar="FILE", help="the workload file")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="first N requests only")
    add_scheduler_options(p, max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=2048,
                          num_kv_blocks=4096)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = recorder_options(args)
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit: must be >= 1, got {args.limit}")
    reqs = workloads.read_file(args.format, args.file, args.limit)
    if not reqs:
        raise UsageError(f"{args.file}:0: file: no requests")
    clamped = workloads.clamp(reqs, options["setup"].max_model_len)
    record_and_print(args.out, reqs, clamped, spec=f"{args.format}:{args.file}",
                     source_kind="imported", tool="simrig import",
                     extra_source={"format": args.format, "limit": args.limit, "clamped": clamped,
                                   "step_time_model": "12 ms + 0.06 ms/token"}, **options)
    return 0
