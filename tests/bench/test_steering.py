"""Steered against unsteered campaigns on the same seeds: how soon each stops reaching new
MRV2 arcs (examples and seconds to the last new arc) and how many it reached.

One round = the same seed once unsteered (setup, untimed) and once steered (timed), both
with coverage on and no corpus, so the only difference is Hypothesis' ``target()`` on the
arcs an example reaches. ``extra_info`` lists per seed both arms' figures. Recorded, not
asserted (README, Coverage: steering stays opt-in because it measured no gain).
"""

from __future__ import annotations

import os

import pytest

from simrig.campaign.fuzz import Campaign, CampaignOptions

pytestmark = [pytest.mark.bench, pytest.mark.vllm]

ROUNDS = int(os.environ.get("SIMRIG_BENCH_ROUNDS", "5"))
EXAMPLES = int(os.environ.get("SIMRIG_BENCH_STEER_EXAMPLES", "60"))  # > 40: the target phase acts


def _campaign(tmp_path, seed: int, steer: bool) -> dict:
    options = CampaignOptions(budget_s=None, max_examples=EXAMPLES, seed=seed, database=None,
                              replay_regressions=False, coverage=True, steer=steer, corpus_dir=None,
                              stages=("gather", "dummy"), progress="quiet",
                              out_dir=tmp_path / f"{'steer' if steer else 'plain'}-{seed}")
    campaign = Campaign(options)
    campaign.run()
    timeline = campaign.coverage_timeline
    last = max((r["example"] for r in timeline if r["new_arcs"]), default=0)
    s = campaign.summary()
    return {"examples": s["examples"], "arcs": s["coverage_arcs"], "examples_to_last_new_arc": last,
            "seconds_to_last_new_arc": s["coverage_last_new_arc_s"]}


def test_steered_vs_unsteered_plateau(benchmark, vllm_api, tmp_path):
    results: dict[str, dict] = {}
    seeds = iter(range(1000))
    current: list[int] = []

    def plain() -> None:
        current.append(next(seeds))
        results[f"seed{current[-1]}_unsteered"] = _campaign(tmp_path, current[-1], steer=False)

    def steered() -> None:
        results[f"seed{current[-1]}_steered"] = _campaign(tmp_path, current[-1], steer=True)

    benchmark.pedantic(steered, setup=plain, rounds=ROUNDS, iterations=1)
    if not current:  # benchmarking disabled (the smoke test): pedantic ran no setup
        plain()
        steered()
    assert all(r["arcs"] > 0 for r in results.values())
    benchmark.extra_info.update({"examples_per_campaign": EXAMPLES, **results})
