"""``simrig contract``: snapshot the observed dtype contract, diff two snapshots."""

from __future__ import annotations

import argparse
from typing import Any

from simrig.errors import UsageError

DEFAULT_OUT = "reports/contract-vllm-{version}.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("contract", help="snapshot or diff the dtype contract of the input path",
                       description="Record the dtype of every output field of every stage of the "
                                   "installed vLLM, or compare two such snapshots.")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    snap = actions.add_parser("snapshot", help="run the built-in scenario and write the observed contract",
                              description="Run a small built-in scenario (fresh and chunked prefill, "
                                          "decode, spec decode, PCP 2) and write stage -> field -> "
                                          "kind/dtype as JSON. Exit 0, or 2 when vLLM is unusable.")
    snap.add_argument("--out", metavar="FILE", default=None,
                      help=f"output file (default {DEFAULT_OUT})")
    snap.set_defaults(func=run_snapshot)
    diff = actions.add_parser("diff", help="compare two snapshots",
                              description="Print every stage/field whose dtype differs. Exit 0 when "
                                          "equal, 1 when they differ, 2 on unreadable files.")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    diff.set_defaults(func=run_diff)


def run_snapshot(args: argparse.Namespace) -> int:
    # cold path: the snapshot and the report writer bring pandas, off `simrig --help`
    from simrig.report.snapshot import write_snapshot
    from simrig.report.writer import check_out_file  # cold path (see above)

    if args.out:
        check_out_file(args.out)  # before the vLLM import and the scenario
    snapshot = build_snapshot()
    out = args.out or DEFAULT_OUT.format(version=snapshot["vllm_version"])
    write_snapshot(out, snapshot)
    n = sum(len(f) for f in snapshot["stages"].values())
    print(f"wrote {out}: vLLM {snapshot['vllm_version']}, {len(snapshot['stages'])} stages, {n} fields")
    return 0


def build_snapshot(api: Any = None) -> dict[str, Any]:
    """Run the built-in scenario through the real installed vLLM."""
    # cold path: the harness drives vLLM, off `simrig --help`
    from simrig.harness import Harness
    from simrig.report.snapshot import SCENARIO_CONFIG, scenario_steps, snapshot_from_observations  # cold

    harness = Harness(SCENARIO_CONFIG, api=api)
    observations = [harness.run_step(step) for step in scenario_steps()]
    errors = [f"step {o.index} {s.stage}: {s.error.type}: {s.error.message}"
              for o in observations for s in o.errors if s.error is not None]
    if errors:
        raise UsageError(f"contract scenario failed on vLLM {harness.api.version}: {errors[0]}")
    return snapshot_from_observations(observations, harness.api.version)


def run_diff(args: argparse.Namespace) -> int:
    from simrig.report.snapshot import diff_snapshots, load_snapshot  # cold path: pandas

    a, b = load_snapshot(args.a), load_snapshot(args.b)
    rows = diff_snapshots(a, b)
    va, vb = a.get("vllm_version", "?"), b.get("vllm_version", "?")
    if not rows:
        print(f"no dtype differences ({va} vs {vb})")
        return 0
    head = ("stage", "field", f"A ({va})", f"B ({vb})")
    table = [head] + [(r.stage, r.field, r.a, r.b) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for i, row in enumerate(table):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"{len(rows)} dtype difference(s)")
    return 1
