"""Flags several commands share, with one meaning everywhere, and their checks.

``add_output_flags`` (--out, --progress, --quiet, --json), ``add_summary_md_flag``,
``add_memcheck_flag`` (--memcheck / --no-memcheck, on by default: replay, fuzz, selftest),
``add_step_timeout_flag`` and ``add_run_flags`` (all of them, and
--coverage, for replay and fuzz); ``add_scheduler_options`` (record and import).
--verbose and --known are added by ``simrig.cli.dispatch``. What a flag means for
a command is in docs/commands.md, 'Flags every report-writing command shares'.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from simrig.coverage.session import add_coverage_flags
from simrig.errors import UsageError
from simrig.sources.workloads import SAMPLING_MIXES


def add_output_flags(p: argparse.ArgumentParser, kind: str, *, out_default: str | None = None) -> None:
    p.add_argument("--out", default=out_default, metavar="DIR",
                   help=f"report directory (default: {out_default or f'reports/{kind}-<UTC time>'})")
    p.add_argument("--progress", choices=("tty", "plain", "quiet"), default=None,
                   help="progress on stderr (default: tty on a terminal, else plain)")
    p.add_argument("--quiet", action="store_true", help="same as --progress quiet")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON on stdout (the human lines are not printed)")


def add_summary_md_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--summary-md", default=None, metavar="FILE",
                   help="also write a short Markdown summary (verdict, new classes with their "
                        "reproducers, changes since the previous run of the suite) to FILE, for a "
                        "CI job page (e.g. cat FILE >> $GITHUB_STEP_SUMMARY)")


def add_memcheck_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memcheck", action=argparse.BooleanOptionalAction, default=True,
                   help="check every load and store of MRV2's interpreted kernels against the "
                        "tensors the launch was handed (CPU mode; about 1.02-1.25x the time): an "
                        "out-of-bounds access is a KernelMemoryError finding naming kernel, "
                        "argument, index and bounds (default on; --no-memcheck turns it off)")


def add_step_timeout_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step-timeout", type=float, default=None, metavar="SECONDS",
                   help="the run's worker process opens a stage of vLLM's code at least this often, "
                        "or it hangs: it is killed and what it ran becomes a crash class "
                        "(default 600)")


def add_run_flags(p: argparse.ArgumentParser, kind: str) -> None:
    """The flags of a judged run in a supervised worker (replay, fuzz): output, --summary-md,
    --memcheck and --coverage (both on by default), --step-timeout."""
    add_output_flags(p, kind)
    add_summary_md_flag(p)
    add_memcheck_flag(p)
    add_step_timeout_flag(p)
    add_coverage_flags(p, default=True)


def check_summary_md(args: argparse.Namespace) -> None:
    """Refuse an unwritable --summary-md before the run (exit 2)."""
    if getattr(args, "summary_md", None):
        from simrig.report.writer import check_out_file  # cold path: pandas off `simrig --help`

        check_out_file(args.summary_md, "--summary-md")


def check_step_timeout(args: argparse.Namespace) -> None:
    if getattr(args, "step_timeout", None) is not None and args.step_timeout <= 0:
        raise UsageError(f"--step-timeout: must be > 0 seconds, got {args.step_timeout}")


@contextlib.contextmanager
def scoped_env(name: str, value: str | None) -> Iterator[None]:
    """``name=value`` while the command runs (None: the environment is left as it is), set
    before vLLM is imported, so this process and every worker or child it starts reads it;
    put back after, so an in-process caller's next command starts from its own environment."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


def memcheck_env(on: bool) -> contextlib.AbstractContextManager[None]:
    """SIMRIG_MEMCHECK=1 (``on``, the default) or 0 (--no-memcheck) while the command runs: the
    checker goes in or not (``simrig.vllm_runtime.interpreter_patches``; never in CUDA mode)."""
    return scoped_env("SIMRIG_MEMCHECK", "1" if on else "0")


def progress_mode(args: argparse.Namespace) -> str | None:
    """The --progress mode; --quiet means quiet. (Progress is on stderr, so --json,
    which owns stdout, leaves it alone.)"""
    if getattr(args, "quiet", False):
        return "quiet"
    mode = getattr(args, "progress", None)
    if mode is None and not sys.stderr.isatty():
        return "plain"
    return mode


def open_history_store(args: argparse.Namespace) -> Any:
    """The store ``--store`` (or $SIMRIG_HISTORY) names, checked before reading:
    recording on, ``--since`` an ISO date/time, ``runs/`` present (UsageError)."""
    from simrig.history.store import history_dir  # cold path: pandas off `simrig --help`

    store = Path(args.store) if args.store else history_dir()
    if store is None:
        raise UsageError("--store: history recording is off (SIMRIG_HISTORY=none); name a store")
    if args.since:
        try:
            datetime.fromisoformat(args.since)
        except ValueError:
            raise UsageError(f"--since: not an ISO date/time: {args.since!r}") from None
    if not (store / "runs").is_dir():
        raise UsageError(f"--store: {store} holds no history yet (runs/ is missing)")
    return store


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
    g.add_argument("--sampling-mix", choices=tuple(SAMPLING_MIXES), default="none",
                   help="each request's sampling parameters, from a fixed mix by its id (docs/recording.md): "
                        "chat (production-like), greedy, or none (vLLM's defaults; the default)")


def recorder_options(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler options checked (UsageError), as ``simrig.sources.record.record_to_file``'s
    keywords: the scheduler ``setup`` and the sampler's and clock's knobs."""
    from simrig.report.writer import check_out_file  # cold path: pandas off `simrig --help`
    from simrig.vllm_parts.scheduler import SchedulerSetup  # cold path: vLLM's config

    if not args.out.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
        raise UsageError(f"--out: {args.out}: expected a .jsonl, .jsonl.gz or .jsonl.zst name")
    check_out_file(args.out)
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
    setup = SchedulerSetup(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, num_kv_blocks=args.num_kv_blocks,
        prefix_caching=args.prefix_caching, num_speculative_tokens=args.num_speculative_tokens,
        pcp_size=args.pcp_size, max_loras=args.max_loras)
    return dict(setup=setup, seed=args.seed, acceptance_rate=args.acceptance_rate, eos_prob=args.eos_prob,
                max_steps=args.steps, time_scale=args.time_scale, sampling_mix=args.sampling_mix)
