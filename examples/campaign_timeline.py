"""A fuzz campaign's report in pandas: when each finding class was first seen, and how
the coverage of vLLM's MRV2 code grew, as one PNG.

    python examples/campaign_timeline.py REPORT_DIR [OUT.png]

REPORT_DIR is the ``--out`` of ``simrig fuzz`` (or ``reports/demo/fuzz`` after ``make demo``).
It reads only the report's files, so it needs pandas, pyarrow and matplotlib, not vLLM:

    classes.parquet             one row per finding class: verdict, kind, stage, field,
                                first_elapsed_s and first_example (seconds and example
                                number into the campaign; NaN and -1 for a class first
                                seen while replaying traces/regressions/)
    coverage_timeline.parquet   campaigns run with --coverage: per example its MRV2 arcs,
                                new arcs and the running total arcs_total
    summary.json                the run's facts (examples, steps, elapsed_s, classes)

Prints one line per class and a count that equals ``summary.json``'s ``classes.classes``.
A nightly-campaign owner would run it over ``--out reports/nightly/$(date +%F)``, or read
``reports/history/runs`` and ``reports/history/classes`` the same way for trends across nights.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: write the PNG only
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

VERDICT_COLOURS = {"new": "#c0392b", "known": "#7f8c8d", "expected": "#27ae60"}


def load(report: Path) -> tuple[pd.DataFrame, pd.DataFrame | None, dict]:
    """The class table, the coverage timeline (None without --coverage) and the summary."""
    classes = pd.read_parquet(report / "classes.parquet")
    timeline_path = report / "coverage_timeline.parquet"
    timeline = pd.read_parquet(timeline_path) if timeline_path.exists() else None
    summary = json.loads((report / "summary.json").read_text(encoding="utf-8"))
    return classes, timeline, summary


def class_timeline(classes: pd.DataFrame) -> pd.DataFrame:
    """One row per class in the order first seen, with the running count of classes.
    Classes the regression replay found before the campaign started sit at 0 s."""
    seen = classes.assign(first_s=classes["first_elapsed_s"].fillna(0.0))
    seen = seen.sort_values(["first_s", "first_example", "signature"], kind="stable")
    return seen.assign(classes_so_far=range(1, len(seen) + 1))


def plot(classes: pd.DataFrame, timeline: pd.DataFrame | None, summary: dict, out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    seen = class_timeline(classes)
    end_s = float(summary.get("elapsed_s") or (seen["first_s"].max() if len(seen) else 0.0))
    # the running count from 0 at the start to the total at the campaign's end
    xs = [0.0, *seen["first_s"], max(end_s, *seen["first_s"], 0.0)]
    ys = [0, *seen["classes_so_far"], len(seen)]
    left.step(xs, ys, where="post", color="#34495e")
    if len(seen):
        for verdict, rows in seen.groupby("verdict"):
            left.scatter(rows["first_s"], rows["classes_so_far"], label=verdict,
                         color=VERDICT_COLOURS.get(verdict, "#2980b9"), zorder=3)
        left.legend(title="verdict")
    left.set_xlim(left=0)
    left.set_ylim(bottom=0)
    left.yaxis.get_major_locator().set_params(integer=True)
    left.set_xlabel("seconds into the campaign")
    left.set_ylabel("finding classes seen")
    left.set_title("Finding classes, first seen")
    if timeline is not None and len(timeline):
        right.plot(timeline["example"], timeline["arcs_total"], color="#8e44ad")
        right.xaxis.get_major_locator().set_params(integer=True)
        right.set_ylabel("MRV2 branch arcs reached (cumulative)")
        right.set_title("Coverage of the MRV2 code")
    else:
        right.text(0.5, 0.5, "no coverage_timeline.parquet\n(run the campaign with --coverage)",
                   ha="center", va="center", transform=right.transAxes)
        right.set_title("Coverage of the MRV2 code")
    right.set_xlabel("example")
    fig.suptitle(f"{summary.get('examples', '?')} examples, {summary.get('steps', '?')} steps, "
                 f"vLLM {summary.get('vllm_version', '?')}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a simrig fuzz report directory (--out)")
    parser.add_argument("out", type=Path, nargs="?", default=Path("campaign_timeline.png"),
                        help="the PNG to write (default campaign_timeline.png)")
    args = parser.parse_args(argv)
    if not (args.report / "classes.parquet").is_file():
        print(f"campaign_timeline: error: {args.report}: no classes.parquet (not a simrig report)",
              file=sys.stderr)
        return 2
    classes, timeline, summary = load(args.report)
    for row in class_timeline(classes).itertuples():
        where = ("regressions" if row.first_example < 0
                 else f"example {row.first_example}, {row.first_s:.1f} s")
        print(f"  [{row.verdict}] {row.signature}: first at {where}, {row.occurrences} occurrence(s)")
    counts = classes["verdict"].value_counts()
    print(f"classes: {len(classes)} ({', '.join(f'{v} {counts.get(v, 0)}' for v in VERDICT_COLOURS)})")
    if timeline is not None and len(timeline):
        last = timeline.iloc[-1]
        print(f"coverage: {int(last['arcs_total'])} MRV2 arcs after {int(last['example'])} examples")
    plot(classes, timeline, summary, args.out)
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
