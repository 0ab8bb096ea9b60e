"""``simrig record``: drive vLLM's real scheduler with a workload, write a trace (the recording is
``simrig.sources.record``'s, the options ``simrig.cli.flags.add_scheduler_options``, as for import)."""

from __future__ import annotations

import argparse

from simrig.cli.flags import add_scheduler_options, recorder_options
from simrig.sources import workloads
from simrig.sources.record import record_and_print

DESCRIPTION = """Drive vLLM's real v1 Scheduler (offline, CPU) with a workload and a synthetic
    sampler; write every SchedulerOutput as a trace step. SPEC:
    synthetic:requests=N,rate=R,prompt=LO-HI,output=LO-HI,shared_prefix=F
    (also prefixes, prefix_len, seed), or azure:PATH, burstgpt:PATH, mooncake:PATH."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="record a trace from vLLM's real scheduler", description=DESCRIPTION)
    p.add_argument("--workload", required=True, metavar="SPEC", help="workload SPEC")
    add_scheduler_options(p, max_model_len=2048)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = recorder_options(args)
    reqs = workloads.parse_spec(args.workload)
    clamped = workloads.clamp(reqs, options["setup"].max_model_len)
    record_and_print(args.out, reqs, clamped, spec=args.workload, **options)
    return 0
