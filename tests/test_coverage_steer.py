"""Coverage-steered campaigns: the corpus of examples that reached new MRV2 arcs,
replayed first by the next campaign, and the plateau figures."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simrig.campaign.fuzz import plateau
from simrig.cli import main


def test_plateau_is_the_last_new_arc_and_the_time_95_percent_was_reached():
    timeline = [{"elapsed_s": 1.0, "new_arcs": 50, "arcs_total": 50},
                {"elapsed_s": 2.0, "new_arcs": 45, "arcs_total": 95},
                {"elapsed_s": 3.0, "new_arcs": 0, "arcs_total": 95},
                {"elapsed_s": 4.0, "new_arcs": 5, "arcs_total": 100},
                {"elapsed_s": 5.0, "new_arcs": 0, "arcs_total": 100}]
    assert plateau(timeline) == {"coverage_last_new_arc_s": 4.0, "coverage_95_s": 2.0}
    assert plateau([]) == {"coverage_last_new_arc_s": None, "coverage_95_s": None}


@pytest.mark.vllm
def test_a_steered_campaign_keeps_new_coverage_and_the_next_replays_it_first(vllm_api, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    args = ["fuzz", "--max-examples", "3", "--database", "none", "--no-regressions", "--stages", "gather",
            "--steer", "--corpus", str(corpus), "--quiet", "--json"]
    assert main([*args, "--seed", "5", "--out", str(tmp_path / "a")]) == 0
    first = json.loads(capsys.readouterr().out)
    kept = sorted(corpus.glob("valid-*.jsonl"))
    # the first example reaches arcs nothing before it did: at least it is kept
    assert first["steer"] is True and first["corpus_kept"] == len(kept) >= 1
    timeline = pd.read_parquet(tmp_path / "a" / "coverage_timeline.parquet")
    assert len(timeline) == first["examples"] and timeline.arcs_total.is_monotonic_increasing
    assert timeline.new_arcs.iloc[0] == timeline.arcs_total.iloc[0] > 0
    assert main([*args, "--seed", "6", "--out", str(tmp_path / "b")]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["corpus_replayed"] == len(kept)
    assert second["regression_steps"] >= len(kept)  # their steps ran before any example


def test_steer_flags_are_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["fuzz", "--help"])
    text = capsys.readouterr().out
    for flag in ("--steer", "--corpus", "--coverage", "--unreached", "--fail-on-unexplained-coverage"):
        assert flag in text
