"""One rule for the verdict: every class printed NEW fails the run, in the
banner, classes.csv, summary.json, JUnit and the exit status alike, also when
a known entry documents another finding of the same signature.

The seeded fault is ours (not the self-test's catalogue): on every other
dummy batch, ``InputBatch.make_dummy`` fills its positions with ones. The
known entry of that field documents all-zero dummy positions
(``reports/baselines``), so the zeroed dummies stay known and the ones filled
with ones are a different bug in the same field: a new class beside the
known one.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simrig.campaign import shrink
from simrig.campaign.fuzz import Campaign, CampaignOptions, FindingClass
from simrig.findings.classes import Where, fails_run
from simrig.findings.findings import Finding
from simrig.step import NewRequest, RunnerConfig, Step
from simrig.vllm_runtime.mutate import Mutant
from tests import mutant_cli

SIGNATURE = ("dtype_drift", "dummy", "logits_indices", "")


def _finding(known: bool, actual: str) -> Finding:
    return Finding(kind="dtype_drift", step=0, stage="dummy", check="parity", field="logits_indices",
                   message=f"logits_indices is {actual}, expected torch.int64", known=known)


def test_a_known_entry_never_covers_a_new_finding_of_the_same_signature(tmp_path, monkeypatch):
    monkeypatch.setattr(shrink, "replay_with_checks", lambda *a, **k: ([], 1))  # no vLLM here
    campaign = Campaign(CampaignOptions(out_dir=tmp_path / "out", progress="quiet", database=None))
    known, new = _finding(True, "torch.int32"), _finding(False, "torch.int16")
    assert shrink.class_key(known) != shrink.class_key(new)
    assert shrink.class_key(known)[:4] == shrink.class_key(new)[:4] == SIGNATURE
    for finding in (known, new):  # the known one first: it must not decide the class
        cls = FindingClass(shrink.class_key(finding), finding, count=2, config=RunnerConfig(),
                           steps=[Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})])
        campaign.classes[cls.key] = cls
        campaign.tally.add(finding, Where("example-0", example=0), count=2)
    assert campaign.exit_status() == 1
    campaign.finish()
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failing_classes"] == 1 and summary["exit_status"] == 1
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    rows = classes[classes["signature"] == "dtype_drift · dummy · logits_indices"]
    assert sorted(rows["verdict"]) == ["known", "new"]
    junit = (out / "junit.xml").read_text()
    assert 'failures="1"' in junit and junit.count("<failure") == 1


def test_fails_run_is_the_new_verdict_alone():
    assert [v for v in ("new", "known", "expected") if fails_run(v)] == ["new"]


SEEDED = Mutant(
    "dummy-positions-ones-every-other", "vllm.v1.worker.gpu.input_batch", "InputBatch.make_dummy",
    "positions = input_buffers.positions[:num_tokens].zero_()\n",
    "positions = input_buffers.positions[:num_tokens].zero_()\n"
    "    if num_reqs % 2 == 0:  # the method's body, as mutate compiles it (dedented)\n"
    "        positions.fill_(1)\n",
    "every other dummy's positions are all ones")


@pytest.mark.vllm
@pytest.mark.slow
def test_a_seeded_fault_in_a_known_field_fails_the_campaign(tmp_path):
    out = tmp_path / "fuzz"
    proc = mutant_cli.run(["fuzz", "--max-examples", "12", "--seed", "1", "--database", "none",
                           "--no-regressions", "--no-coverage", "--pcp-sizes", "1", "--progress", "quiet",
                           "--out", str(out)], SEEDED)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_status"] == 1 and summary["failing_classes"] >= 1
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    rows = classes[(classes["kind"] == "value_mismatch") & (classes["field"] == "positions")
                   & (classes["stage"] == "dummy")]
    assert "new" in set(rows["verdict"]) and "known" in set(rows["verdict"]), rows[["signature", "verdict"]]
    new = rows[rows["verdict"] == "new"].iloc[0]
    assert new["reproducer"], new.to_dict()
    assert "new finding class" in proc.stdout.splitlines()[1] or "new finding class" in proc.stdout
    assert "<failure" in (out / "junit.xml").read_text()
