"""When a fuzz campaign stops running the real code, and whether its run is repeatable.

A campaign explores until ``--max-examples`` examples ran or the time budget
is spent; a Hypothesis run that is shrinking a failure may go on for a grace
period past the budget. With ``--max-examples`` alone the run never stops on
the clock, so the same seed gives the same run.
"""

from __future__ import annotations

import time


class StopRules:
    """The stop rules of ``simrig.campaign.fuzz.Campaign``: they read its
    options, stats and stop flags (interrupted, rig_stopped, idle)."""

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _over_budget(self, grace: float = 0.0) -> bool:
        budget = self.options.budget_s
        return budget is not None and self._elapsed() > budget + grace

    def _grace(self) -> float:
        o = self.options
        if o.shrink_grace_s is not None:
            return o.shrink_grace_s
        return min(120.0, o.budget_s / 4) if o.budget_s is not None else float("inf")

    def _examples_done(self) -> bool:
        m = self.options.max_examples
        return m is not None and self.stats.examples >= m

    def _explore_more(self) -> bool:
        """Start another Hypothesis run? Never once the examples or the budget are spent."""
        return not (self.interrupted or self.rig_stopped or self.idle or self._examples_done()
                    or self._over_budget())

    def stopped(self) -> bool:
        """Rules stop running the real code: interrupted, a rig error, the
        examples or the budget spent while exploring, or past budget + grace
        while Hypothesis shrinks a failure (with --max-examples alone, the
        shrink always finishes: the same seed gives the same run)."""
        if self.interrupted or self.rig_stopped:
            return True
        if self._chunk_failed:
            return self._over_budget(self._grace())
        return self._examples_done() or self._over_budget()

    def _stopped_by(self) -> str:
        if self.rig_stopped:
            return "rig_error"
        if self.interrupted:
            return "signal"
        if self._examples_done():
            return "max_examples"
        return "idle" if self.idle else "budget"

    def not_repeatable(self) -> list[str]:
        """Why the same --seed may not give the same examples (empty: it will)."""
        why = {"budget": "stopped by the time budget", "signal": "stopped by a signal",
               "crashes": "stopped after too many crashed workers"}
        reasons = [why[self.stats.stopped_by]] if self.stats.stopped_by in why else []
        if self.options.database is not None:
            reasons.append("an example database replays earlier failures first")
        return reasons

    def _interrupt(self) -> None:
        self.interrupted = True
