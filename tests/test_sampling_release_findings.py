"""What the valid sampling campaigns on 0.30.0-0.33.0 found, pinned: the shrunk trace of a
prompt-logprobs request whose final prefill chunk carries placeholder drafts (vLLM hands out a
row past the prompt), known on 0.30.0-0.33.0 by its precise signature and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.findings import findings as fk
from simrig.findings.known import load_known_findings

TRACE = Path(__file__).resolve().parent / "fixtures" / "prompt_logprobs_placeholder_drafts.jsonl"


def _rows(pattern: str) -> list[fk.Finding]:
    return [fk.Finding(kind=fk.VALUE_MISMATCH, step=0, stage="postprocess", check="sampling",
                       field="output.prompt_logprobs", expected="positions 21 .. 20",
                       actual="positions 21 .. 21", extra={"pattern": pattern} if pattern else {})]


DRAFTS, NO_DRAFTS = {"num_speculative_tokens": 1}, {"num_speculative_tokens": 0}


def test_rows_past_the_prompt_are_known_only_by_their_signature():
    for release in ("0.30.0", "0.31.0", "0.32.0", "0.33.0"):
        table = load_known_findings(release)
        found = table.apply(_rows("rows_past_prompt"), DRAFTS)[0]
        assert found.known and found.known_by.endswith("known-findings.json#71")
        assert not table.apply(_rows(""), DRAFTS)[0].known  # a row early or repeated: new
        assert not table.apply(_rows("rows_past_prompt"), NO_DRAFTS)[0].known  # without drafts: new
    # releases before the MRV2 sampler's prompt logprobs, and later ones: not yet known
    for release in ("0.29.0", "0.34.0"):
        assert not load_known_findings(release).apply(_rows("rows_past_prompt"), DRAFTS)[0].known


@pytest.mark.vllm
def test_the_shrunk_campaign_trace_replays_to_the_known_class_only():
    """Prompt 22 tokens, 21 computed at admission, the last prompt token and one placeholder
    draft scheduled, prompt_logprobs 0: vLLM hands out a row for position 21, none is due."""
    from simrig.replay import replay_trace  # lazy: imports vLLM

    result = replay_trace(TRACE)
    rows = result.findings[result.findings["field"] == "output.prompt_logprobs"]
    assert len(rows) == 1
    assert rows.iloc[0]["expected"] == "positions 21 .. 20" and rows.iloc[0]["actual"] == "positions 21 .. 21"
    assert rows.iloc[0]["known_by"].endswith("known-findings.json#71")
    assert set(result.findings["verdict"]) <= {"known"}

