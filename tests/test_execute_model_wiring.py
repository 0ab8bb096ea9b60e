"""The harness decides no call argument: vLLM's own execute_model does.

A change to execute_model's wiring (a mutant of the installed function, in a
child process) must become a new finding, on replay of a trace and in a
campaign. The traces are exactly what the shrinker wrote for these mutants.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.cli import main
from simrig.selftest.mutant_runs import run_child

WIRING = Path(__file__).parent / "fixtures" / "wiring"
# mutant -> (its shrunk trace, the first finding replay reports there: kind, stage, field).
# A one-token prefill under PCP 2 dispatched to the varlen FULL decode graph: PCP rank 0's
# partition of that padded batch raises in execute_model before any value check runs.
CASES = {
    "execute-model-prefill-keeps-max-query-len":
        ("prefill-keeps-max-query-len.jsonl", ("exception", "partition", "")),
    "execute-model-pcp-dispatches-global-tokens":
        ("pcp-dispatches-global-tokens.jsonl", ("value_mismatch", "dispatch", "num_tokens")),
}


@pytest.mark.parametrize("mutant", sorted(CASES))
def test_unmutated_execute_model_replays_clean(mutant, tmp_path, capsys):
    trace, _ = CASES[mutant]
    assert main(["replay", "--no-coverage", str(WIRING / trace), "--out", str(tmp_path / "r"),
                 "--progress", "quiet"]) == 0, capsys.readouterr().out


@pytest.mark.slow  # a mutated runner per case, replayed in a child process: ~30 s each
@pytest.mark.parametrize("mutant", sorted(CASES))
def test_a_wiring_change_is_a_new_finding_on_replay(mutant, tmp_path):
    trace, signature = CASES[mutant]
    result = run_child(mutant, budget_s=0, seed=0, baseline=[], traces=[WIRING / trace],
                       out_dir=tmp_path, timeout_s=300)
    assert result.error == ""
    assert result.detected and result.via == f"replay:{trace}"
    assert tuple(result.signature[:3]) == signature


@pytest.mark.slow
def test_a_wiring_change_is_a_new_finding_in_a_campaign(tmp_path):
    """No trace: the fuzz campaign alone finds execute_model keeping the query
    bound of a batch with a prefill."""
    result = run_child("execute-model-prefill-keeps-max-query-len", budget_s=90, seed=0,
                       baseline=[], traces=[], out_dir=tmp_path, timeout_s=400)
    assert result.error == ""
    assert result.detected and result.via == "fuzz:valid"
    assert result.shrunk_steps is not None and result.shrunk_steps >= 1
