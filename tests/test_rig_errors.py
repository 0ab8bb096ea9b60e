"""The rig never crashes: every check module, fed a malformed observation,
answers with a ``rig_error`` finding (traceback included), never an exception.

Malformed here means what a bug in simrig's own observation code could hand a
check: a field that is not a FieldObs, an error that is not an ErrorObs,
per-request arrays of disagreeing lengths.
"""

from __future__ import annotations

import numpy as np

from simrig.checks.checker import Checker, check_step
from simrig.checks.lifecycle import runner_errors
from simrig.checks.parity import check_parity
from simrig.findings import findings as fk
from simrig.findings.known import KnownFindings
from simrig.observe import FieldObs, StageObs, StepObs
from simrig.partition.pcp import check_pcp
from simrig.reference.contract import DriftTracker, check_contract
from simrig.reference.reference import ReferenceModel
from simrig.step import NewRequest, RunnerConfig, Step

NOT_A_FIELD = object()  # what a broken observer might store instead of a FieldObs


def arr(values, dtype, kind="torch") -> FieldObs:
    a = np.asarray(values, dtype=dtype)
    return FieldObs(kind, a.dtype.name, a.shape, a)


def only_rig_error(found, check, step=7):
    assert len(found) == 1, found
    f = found[0]
    assert (f.kind, f.check, f.step) == (fk.RIG_ERROR, check, step)
    assert "Traceback" in f.traceback and f.exception_type
    assert f.row()["traceback"] == f.traceback  # the report's findings table carries it
    return f


def test_contract_module():
    f = only_rig_error(check_contract(7, StageObs("prepare", fields={"idx_mapping": NOT_A_FIELD})),
                       "contract")
    assert f.stage == "prepare"
    only_rig_error(DriftTracker().check(7, StageObs("gather", fields={"x": NOT_A_FIELD})), "drift")


def test_parity_module():
    real = StageObs("prepare", fields={"num_draft_tokens": NOT_A_FIELD, "seq_lens": NOT_A_FIELD})
    only_rig_error(check_parity(7, real, StageObs("dummy", fields={"seq_lens": arr([1], np.int32)})),
                   "parity")


def test_pcp_module():
    # three requests' query lengths but one is_prefilling flag
    prepare = StageObs("prepare", fields={
        "req_ids": FieldObs("list", "", (3,), ["a", "b", "c"]),
        "num_scheduled_tokens": arr([4, 4, 4], np.int32, "numpy"),
        "is_prefilling_np": arr([True], bool, "numpy"),
        "query_start_loc_np": arr([0, 4, 8, 12], np.int32, "numpy"),
        "positions": arr(np.arange(12), np.int64), "input_ids": arr(np.arange(12), np.int32),
        "idx_mapping_np": arr([0, 1, 2], np.int64, "numpy"),
        "num_computed_tokens_np": arr([0, 0, 0], np.int32, "numpy")})
    cfg = RunnerConfig(pcp_size=2)
    only_rig_error(check_pcp(7, cfg, prepare, [StageObs("partition", rank=0)]), "pcp")


def test_reference_module():
    model = ReferenceModel(RunnerConfig())
    step = Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})
    model.apply_lifecycle(step)
    obs = StepObs(7, [StageObs("gather", fields={"req_ids": NOT_A_FIELD})])
    only_rig_error(model.compare(7, step, obs), "reference")


def test_lifecycle_module():
    broken = StageObs("gather", error="KeyError: 'a'")  # a string, not an ErrorObs
    only_rig_error(runner_errors(7, StepObs(7, [broken])), "runner_errors")


def test_checker_module_keeps_other_checks_running():
    """One check crashing costs only that check: the contract still reports
    the int32 idx_mapping next to the rig_error of the crashed check."""
    checker = Checker(RunnerConfig(), known=KnownFindings([]))
    step = Step(new_requests=[NewRequest("a", 2)], num_scheduled_tokens={"a": 2})
    obs = StepObs(7, [StageObs("prepare", fields={"idx_mapping": arr([0], np.int32),
                                                  "num_tokens": NOT_A_FIELD})])
    found = checker.check(7, step, obs)
    kinds = {(f.kind, f.check) for f in found}
    assert (fk.DTYPE_DRIFT, "contract") in kinds
    assert (fk.RIG_ERROR, "reference") in kinds


def test_checker_survives_a_malformed_observation_object():
    checker = Checker(RunnerConfig(), known=KnownFindings([]))
    step = Step(new_requests=[NewRequest("a", 2)], num_scheduled_tokens={"a": 2})
    found = checker.check(7, step, StepObs(7, stages=[NOT_A_FIELD]))
    assert fk.RIG_ERROR in {f.kind for f in found}


def test_extra_check_that_raises_is_a_rig_error():
    def exploding(index, step, obs):
        raise ZeroDivisionError("boom")

    checker = Checker(RunnerConfig(), known=KnownFindings([]))
    step = Step(new_requests=[NewRequest("a", 2)], num_scheduled_tokens={"a": 2})
    found = check_step(checker, [exploding], 7, step, StepObs(7), None, "t.jsonl")
    f = only_rig_error([f for f in found if f.kind == fk.RIG_ERROR], "extra:exploding")
    assert f.trace == "t.jsonl" and "ZeroDivisionError: boom" in f.message


def test_findings_module_guard_keeps_the_step_index():
    @fk.guarded("mine")
    def check(stage, index):
        raise RuntimeError("bad")

    only_rig_error(check(StageObs("dummy"), index=7), "mine")


def test_harness_crash_is_a_rig_error():
    from simrig.harness import run_step_guarded

    class BrokenHarness:
        num_steps = 0

        def run_step(self, step):
            self.num_steps += 1
            raise AttributeError("adapter lost a field")

    obs, found = run_step_guarded(BrokenHarness(), Step(), "t")
    assert obs.index == 0
    f = only_rig_error(found, "harness", step=0)
    assert f.trace == "t"


def test_semantics_module():
    from simrig.reference.semantics import check_batch_semantics

    stage = StageObs("dummy", fields={"num_scheduled_tokens": arr([2, 2], np.int32, "numpy"),
                                      "query_start_loc": NOT_A_FIELD})
    only_rig_error(check_batch_semantics(7, stage), "semantics")


def test_replay_reports_a_crashing_check_and_exits_3(tmp_path, monkeypatch, capsys):
    """End to end through the real runner: a check that raises costs that check,
    the report is still written, the traceback is in findings.csv, exit 3."""
    import pandas as pd
    import pytest

    pytest.importorskip("vllm")
    from simrig.checks import checker
    from simrig.cli import main
    from simrig.errors import EXIT_RIG_ERROR

    def broken_parity(index, real, dummy, *args):
        raise IndexError("parity bug")

    monkeypatch.setattr(checker, "check_parity", broken_parity)
    out = tmp_path / "report"
    status = main(["replay", "--no-coverage", "traces/samples/spec_decode.jsonl", "--stages", "gather,prepare,dummy",
                   "--out", str(out), "--quiet"])
    assert status == EXIT_RIG_ERROR, capsys.readouterr()
    findings = pd.read_csv(out / "findings.csv")
    rig = findings[findings.kind == "rig_error"]
    assert len(rig) and rig.check.eq("semantics").all()
    assert rig.traceback.str.contains("IndexError: parity bug").all()
    # the other checks still ran on the same steps
    assert (findings.check == "contract").any()


def test_fuzz_report_is_complete_or_absent(tmp_path, monkeypatch):
    """junit.xml is written inside the staged report; if that fails, OUT is never
    half there (no tables without junit.xml), and no staging folder is left."""
    import pytest

    from simrig.campaign import campaign_report, fuzz

    out = tmp_path / "nightly"
    campaign = fuzz.Campaign(fuzz.CampaignOptions(out_dir=out, progress="quiet"))
    campaign.finish()
    assert (out / "junit.xml").is_file() and (out / "summary.json").is_file()

    def broken(campaign):
        raise RuntimeError("disk full")

    monkeypatch.setattr(campaign_report, "junit_xml", broken)
    out2 = tmp_path / "second"
    with pytest.raises(RuntimeError):
        fuzz.Campaign(fuzz.CampaignOptions(out_dir=out2, progress="quiet")).finish()
    assert not out2.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nightly"]


def test_padding_module():
    from simrig.graph_rules.padding import check_capture, check_dispatch

    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16, cudagraph_mode="FULL_AND_PIECEWISE")
    # a descriptor without its token count, as a broken dispatch observer might hand it over
    only_rig_error(check_dispatch(7, config, {"cg_mode": "FULL"}, np.array([1, 1]), np.array([False, False]),
                                  np.array([True, True])), "dispatch")
    capture = StageObs("capture", fields={"desc.num_tokens": NOT_A_FIELD,
                                          "num_scheduled_tokens": arr([1], np.int32, "numpy")})
    only_rig_error(check_capture(7, config, capture), "capture")


def test_dcp_peer_check():
    from simrig.partition.pcp import check_dcp_peers

    peer = StageObs("partition", rank=0, dcp_rank=1, fields={"seq_lens": NOT_A_FIELD})
    base = StageObs("partition", rank=0, fields={"seq_lens": arr([1], np.int32)})
    only_rig_error(check_dcp_peers(7, StepObs(index=7, stages=[base, peer])), "pcp")


def test_an_exception_at_a_violation_step_is_judged_against_the_known_entries():
    """The runner check reports what vLLM raised at an adversarial step (here `a` admitted
    twice); a known entry of that check and exact text explains it, as an entry of
    runner_errors explains one on valid input. Another text stays new."""
    from simrig.findings.known import KnownFinding
    from simrig.observe import ErrorObs

    text = "PP rank 0 receives a broadcast the last rank never sent this step"
    entry = KnownFinding(kind=fk.EXCEPTION, stage="pipeline", field="", check="runner", explanation="known",
                         versions=">=0.0.0", actual=f"PipelineBroadcastError: {text}")

    def runner_findings(message: str) -> list:
        checker = Checker(RunnerConfig(), known=KnownFindings([entry], "0.31.0"), adversarial=True)
        admit = Step(new_requests=[NewRequest("a", 2)], num_scheduled_tokens={"a": 2})
        check_step(checker, [], 0, admit, StepObs(0), None, "t")
        raised = StepObs(1, stages=[StageObs("pipeline", rank=0, error=ErrorObs("PipelineBroadcastError", message,
                                                                                  ("a",)))])
        found = check_step(checker, [], 1, admit, raised, "duplicate_new", "t")
        return [(f.actual, f.known) for f in found if f.check == "runner"]

    assert runner_findings(text) == [(f"PipelineBroadcastError: {text}", True)]
    assert runner_findings("another text") == [("PipelineBroadcastError: another text", False)]
