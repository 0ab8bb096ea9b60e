"""The fuzz phase of a selftest child: a campaign that stops at the first
finding class the unmutated code does not produce.

Valid mode first (most seeded bugs break valid batches), then adversarial
(bugs that only show on contract-violating input, such as a lookup that no
longer raises for an unknown id). After a detection the campaign runs on
until Hypothesis has shrunk the failing example (at most ``SHRINK_S``), then stops.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from simrig.campaign.fuzz import Campaign, CampaignOptions
from simrig.selftest.mutant_runs import PHASE_FUZZ, ChildResult, counts_as_detection

SHRINK_S = 30.0
VALID_SHARE = 0.6  # of the remaining budget; adversarial gets the rest


class _UntilNew(Campaign):
    """A campaign that notes the first class outside ``baseline`` and then
    stops once it had time to shrink it."""

    def __init__(self, options: CampaignOptions, baseline: set[tuple[str, ...]],
                 collect_all: bool, child_start: float, shrink_s: float = SHRINK_S):
        super().__init__(options)
        self.shrink_s = shrink_s
        self.baseline = baseline
        self.collect_all = collect_all
        self.child_start = child_start
        self.detected_key: tuple | None = None
        self.detected_at: float | None = None  # campaign-elapsed seconds
        self.detected_since_child_start: float | None = None
        self.detected_examples: int | None = None

    def _judge(self, found: list, where: Any, machine: Any) -> list:
        # every finding passes here: a step's, and the seeds check's at an example's end
        failing = super()._judge(found, where, machine)
        if self.detected_key is None and not self.collect_all:
            for f in found:
                if counts_as_detection(f, self.baseline):
                    self.detected_key = tuple(f.signature)
                    self.detected_at = self._elapsed()
                    self.detected_since_child_start = time.monotonic() - self.child_start
                    self.detected_examples = self.stats.examples + 1
                    break
        return failing

    def _explore_more(self) -> bool:
        # a detection ends the campaign once the Hypothesis run that met it has ended: that
        # run shrank the example, and more exploring cannot change the verdict
        return self.detected_at is None and super()._explore_more()

    def stopped(self) -> bool:
        if self.detected_at is not None and self._elapsed() >= self.detected_at + self.shrink_s:
            return True
        return super().stopped()


def fuzz_until_new(result: ChildResult, baseline: set[tuple[str, ...]], budget_s: float, seed: int,
                   out_dir: Path, start: float, collect_all: bool, max_examples: int | None = None) -> None:
    """Fill ``result`` from a valid, then an adversarial campaign sharing ``budget_s``.
    With ``max_examples``: the valid campaign alone, bounded by that many examples
    instead of the clock, stopping at the first detection (no time to shrink)."""
    deadline = time.monotonic() + budget_s
    examples_before = 0
    for mode in ("valid",) if max_examples else ("valid", "adversarial"):
        left = deadline - time.monotonic()
        budget = min(budget_s * VALID_SHARE, left) if mode == "valid" else left
        if budget <= 1 and not max_examples:
            continue
        steer = os.environ.get("SIMRIG_STEER") == "1"  # simrig selftest --steer
        options = CampaignOptions(
            budget_s=None if max_examples else budget, max_examples=max_examples, seed=seed, mode=mode,
            pcp_sizes=(1, 2), out_dir=out_dir / f"{result.mutant}-{mode}", database=None,
            replay_regressions=False, shrink_grace_s=0.0 if max_examples else SHRINK_S,
            progress="quiet", coverage=steer, steer=steer)
        campaign = _UntilNew(options, baseline, collect_all, start, 0.0 if max_examples else SHRINK_S)
        campaign.run()
        if collect_all:
            for cls in campaign.classes.values():
                sig = list(cls.key[:4])
                if sig not in result.signatures and not cls.first.known:  # see child.py
                    result.signatures.append(sig)
                result.new_findings += int(cls.failing)
            continue
        if campaign.detected_key is not None:
            cls = next((c for k, c in campaign.classes.items() if tuple(k[:4]) == campaign.detected_key),
                       None)
            result.detected = True
            result.via = f"fuzz:{mode}"
            result.phase = PHASE_FUZZ.format(mode=mode)
            result.seconds_to_detection = campaign.detected_since_child_start
            result.examples_to_detection = examples_before + (campaign.detected_examples or 0)
            result.kind = campaign.detected_key[0]
            result.signature = list(campaign.detected_key)
            if cls is not None:
                result.message = cls.first.one_line()
                if cls.steps is not None:
                    result.shrunk_steps = len(cls.steps)
                    result.shrunk_trace = str(options.out_dir / "shrunk")
            return
        examples_before += campaign.stats.examples
