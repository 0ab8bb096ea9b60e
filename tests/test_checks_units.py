"""The checks on hand-built observations (no vLLM needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simrig.checks.checker import Checker
from simrig.checks.lifecycle import SchedulerContract
from simrig.checks.parity import check_parity
from simrig.errors import UsageError
from simrig.findings import findings as fk
from simrig.findings.known import KnownFindings, load_known_findings, parse_known_findings
from simrig.observe import ErrorObs, FieldObs, StageObs, StepObs
from simrig.partition.pcp_layout import dispatch_token_count, rank_rows
from simrig.reference.contract import DriftTracker, check_contract
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step


def arr(values, dtype, kind="torch") -> FieldObs:
    a = np.asarray(values, dtype=dtype)
    return FieldObs(kind, a.dtype.name, a.shape, a)


def test_contract_flags_declared_fields_only():
    stage = StageObs("prepare", fields={"idx_mapping": arr([1, 2], np.int32),
                                        "positions": arr([0, 1], np.int64),
                                        "not_in_table": arr([0], np.int8),
                                        "prompt_lens": FieldObs("none", "", (), None)})
    got = check_contract(3, stage)
    assert [(f.kind, f.check, f.field, f.expected, f.actual, f.step) for f in got
            if f.kind == fk.DTYPE_DRIFT] == [
        (fk.DTYPE_DRIFT, "contract", "idx_mapping", "torch int64", "torch int32", 3)]
    # every other declared field is missing from this hand-built stage; prompt_lens
    # is None, which its docstring allows (R-SWA only)
    missing = {f.field for f in got if f.kind == fk.MISSING_FIELD}
    assert "positions" not in missing and "idx_mapping" not in missing
    assert "prompt_lens" not in missing and "seq_lens" in missing


def test_contract_none_only_under_its_documented_condition():
    from simrig.reference.contract import BATCH_CONTRACT

    def stage(**fields):
        full = {name: arr([0], np.dtype(c.dtype), c.kind) for name, c in BATCH_CONTRACT.items()}
        full.update(fields)
        return StageObs("prepare", fields=full)

    none = FieldObs("none", "", (), None)
    scalar = lambda v: FieldObs("scalar", type(v).__name__, (), v)  # noqa: E731
    # no prefill in the batch: prefill_runs_as_decode_np may be None; with one it may not
    assert check_contract(0, stage(prefill_runs_as_decode_np=none, has_prefill=scalar(False))) == []
    got = check_contract(0, stage(prefill_runs_as_decode_np=none, has_prefill=scalar(True)))
    assert [(f.kind, f.field, f.actual) for f in got] == [
        (fk.MISSING_FIELD, "prefill_runs_as_decode_np", "None")]
    # drafts scheduled: num_draft_tokens_per_req must be an array
    assert check_contract(0, stage(num_draft_tokens_per_req=none, num_draft_tokens=scalar(0))) == []
    got = check_contract(0, stage(num_draft_tokens_per_req=none, num_draft_tokens=scalar(2)))
    assert [f.field for f in got] == ["num_draft_tokens_per_req"]
    # gather: the step says whether drafts were scheduled
    gather = StageObs("gather", fields={"num_draft_tokens_np": none})
    assert "num_draft_tokens_np" in {f.field for f in check_contract(0, gather, has_drafts=True)}
    assert "num_draft_tokens_np" not in {f.field for f in check_contract(0, gather, has_drafts=False)}


def test_parity_reports_none_against_an_array():
    real = StageObs("prepare", fields={"prefill_runs_as_decode_np": arr([False, True], bool, "numpy"),
                                       "seq_lens": arr([3, 4], np.int32)})
    dummy = StageObs("dummy", fields={"prefill_runs_as_decode_np": FieldObs("none", "", (), None)})
    got = {(f.kind, f.field, f.actual) for f in check_parity(0, real, dummy)}
    assert got == {(fk.MISSING_FIELD, "prefill_runs_as_decode_np", "None"),
                   (fk.MISSING_FIELD, "seq_lens", "missing")}


def test_drift_reports_each_change_once():
    tracker = DriftTracker()
    a = StageObs("gather", fields={"idx_mapping_np": arr([1], np.int64, "numpy")})
    b = StageObs("gather", fields={"idx_mapping_np": arr([1], np.int32, "numpy")})
    assert tracker.check(0, a) == [] and tracker.check(1, a) == []
    got = tracker.check(2, b)
    assert [(f.check, f.expected, f.actual) for f in got] == [("drift", "numpy int64", "numpy int32")]
    assert tracker.check(3, b) == []


def test_parity_dtype_and_shape():
    real = StageObs("prepare", fields={"seq_lens": arr([3, 4], np.int32), "logits_indices": arr([2, 6], np.int64),
                                       "num_draft_tokens": FieldObs("scalar", "int", (), 0)})
    eager = {"cg_mode": "NONE", "num_tokens": 8, "num_reqs": 2, "uniform_token_count": None,
             "max_query_len": None}

    def dummy_at(desc: dict) -> StageObs:
        fields = {"seq_lens": arr([3], np.int32), "logits_indices": arr([2, 6], np.int32)}
        fields.update({"desc." + k: FieldObs("scalar", "", (), v) for k, v in desc.items()})
        return StageObs("dummy", fields=fields)

    # the dummy run dispatched to the real batch's descriptor: field for field
    got = {(f.kind, f.field) for f in check_parity(0, real, dummy_at(eager), eager)}
    assert got == {(fk.VALUE_MISMATCH, "seq_lens"), (fk.DTYPE_DRIFT, "logits_indices")}
    # at another descriptor (another request count) shapes differ by design: dtype only
    other = dict(eager, num_reqs=1)
    got = {(f.kind, f.field) for f in check_parity(0, real, dummy_at(other), eager)}
    assert got == {(fk.DTYPE_DRIFT, "logits_indices")}


def test_lifecycle_rules():
    cfg = RunnerConfig(max_num_reqs=2, max_num_batched_tokens=10, max_model_len=20)
    c = SchedulerContract(cfg)
    assert c.violations(Step(new_requests=[NewRequest("a", 8)], num_scheduled_tokens={"a": 8})) == []
    rules = {v.rule for v in c.violations(Step(cached=[CachedUpdate("a", 7)], num_scheduled_tokens={"a": 1}))}
    assert rules == {"num_computed_tokens"} and c.desynced == {"a"}
    rules = {v.rule for v in c.violations(Step(
        new_requests=[NewRequest("a", 3), NewRequest("b", 19, num_computed_tokens=15), NewRequest("c", 2)],
        num_scheduled_tokens={"b": 11, "zz": 1}))}
    assert rules >= {"duplicate_new_id", "unknown_scheduled_id", "max_num_batched_tokens", "max_num_reqs",
                     "max_model_len", "prefill_overrun"}
    c2 = SchedulerContract(cfg)
    c2.violations(Step(new_requests=[NewRequest("a", 2)], num_scheduled_tokens={"a": 2}))
    rules = {v.rule for v in c2.violations(Step(finished=["a"], cached=[CachedUpdate("a", 2)],
                                                num_scheduled_tokens={"a": 1}))}
    assert rules == {"scheduled_after_finish"}


def test_runner_exception_on_valid_input_is_a_finding():
    cfg = RunnerConfig()
    checker = Checker(cfg, known=KnownFindings([]))
    step = Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})
    obs = StepObs(0, [StageObs("lifecycle"), StageObs("gather"),
                      StageObs("prepare", error=ErrorObs("RuntimeError", "boom", ("a",)))])
    got = checker.check(0, step, obs)
    assert [(f.kind, f.stage, f.check, f.exception_type) for f in got] == [
        (fk.EXCEPTION, "prepare", "runner_errors", "RuntimeError")]


def test_silent_acceptance_when_nothing_raised():
    checker = Checker(RunnerConfig(), adversarial=True, known=KnownFindings([]))
    got = checker.check(0, Step(num_scheduled_tokens={"ghost": 1}), StepObs(0, [StageObs("lifecycle")]))
    assert {(f.kind, f.req_ids) for f in got} == {(fk.CONTRACT_VIOLATION_INPUT, ("ghost",)),
                                                  (fk.SILENT_ACCEPTANCE, ("ghost",))}


@pytest.mark.parametrize("p,rank,q,expected", [
    (2, 0, 8, [(0, 0, 2), (0, 6, 2)]),  # chunks 0 and 3 of 4
    (2, 1, 8, [(0, 2, 2), (0, 4, 2)]),  # chunks 1 and 2
    (4, 3, 8, [(0, 3, 1), (0, 4, 1)]),  # the pcp_manager docstring picture
    (2, 1, 1, []),  # a one-token prefill lands on rank 0; rank 1 holds nothing (idles)
    (2, 1, 7, [(0, 2, 2), (0, 4, 2)]),  # chunks of 2: 0-1 | 2-3 | 4-5 | 6
    (2, 0, 7, [(0, 0, 2), (0, 6, 1)]),
    (2, 1, 5, [(0, 2, 2), (0, 4, 1)]),  # chunks of 2: 0-1 | 2-3 | 4 | (empty)
    (2, 0, 5, [(0, 0, 2)]),
])
def test_dual_chunk_swap_rows(p, rank, q, expected):
    cfg = RunnerConfig(pcp_size=p)
    assert rank_rows(cfg, np.array([q]), np.array([True]))[rank] == expected


def test_decodes_replicated_or_sharded():
    q, pref = np.array([1, 1, 1, 8]), np.array([False, False, False, True])
    rep = RunnerConfig(pcp_size=2)
    assert rank_rows(rep, q, pref)[1] == [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 2, 2), (3, 4, 2)]
    shard = RunnerConfig(pcp_size=2, shard_decode_requests=True)
    assert rank_rows(shard, q, pref) == [[(0, 0, 1), (2, 0, 1), (3, 0, 2), (3, 6, 2)],
                                         [(1, 0, 1), (3, 2, 2), (3, 4, 2)]]
    assert dispatch_token_count(shard, q, pref) == 6  # rank 0: two decodes and 4 prefill tokens
    dcp = RunnerConfig(pcp_size=2, dcp_size=2)  # 3-token prefill cannot fill 4 chunks: replicated
    assert rank_rows(dcp, np.array([3]), np.array([True])) == [[(0, 0, 3)], [(0, 0, 3)]]


def test_decodes_go_first_in_each_rank():
    """A prefill before a decode in the batch: the rank lists the decode first."""
    cfg = RunnerConfig(pcp_size=2)
    assert rank_rows(cfg, np.array([4, 1]), np.array([True, False])) == [[(1, 0, 1), (0, 0, 1), (0, 3, 1)],
                                                                        [(1, 0, 1), (0, 1, 1), (0, 2, 1)]]


def test_largest_dcp_shard_counts_every_shard():
    from simrig.partition.pcp_layout import dcp_largest_shard

    # token i on DCP rank i % 2 (interleave 1): 5 tokens -> shards of 3 and 2
    assert dcp_largest_shard(np.array([5, 4, 0, 1]), 2).tolist() == [3, 2, 0, 1]
    # interleave 2 over 2 ranks: tokens 0-1, 4-5 | 2-3, 6 -> 4 and 3
    assert dcp_largest_shard(np.array([7]), 2, interleave=2).tolist() == [4]


def test_known_findings_file_for_0_33_0_is_valid_and_applies():
    known = load_known_findings("0.33.0")
    assert len(known) >= 3
    f = fk.Finding(kind=fk.DTYPE_DRIFT, step=0, stage="dummy", check="parity", field="logits_indices",
                   expected="torch int64", actual="torch int32")
    assert known.apply([f])[0].known
    other = fk.Finding(kind=fk.DTYPE_DRIFT, step=0, stage="prepare", check="contract", field="idx_mapping",
                       expected="torch int64", actual="torch int32")
    assert not known.apply([other])[0].known
    assert len(load_known_findings("0.0.0-none")) == 0


def test_bad_known_findings_file_names_the_field(tmp_path):
    with pytest.raises(UsageError, match=r"findings\[0\]\.check"):
        parse_known_findings(json.dumps({"findings": [{"kind": "k", "stage": "s", "field": "f",
                                                       "explanation": "e"}]}), "x.json")


def test_batch_semantics_from_field_meanings():
    from simrig.reference.semantics import check_batch_semantics

    def batch(**over):
        fields = {"num_scheduled_tokens": arr([1, 3], np.int32, "numpy"),
                  "query_start_loc": arr([0, 1, 4], np.int32),
                  "query_start_loc_np": arr([0, 1, 4], np.int32, "numpy"),
                  "num_computed_tokens_np": arr([5, 0], np.int32, "numpy"),
                  "seq_lens": arr([6, 3], np.int32), "positions": arr([5, 0, 1, 2], np.int64),
                  "is_prefilling_np": arr([False, True], bool, "numpy"),
                  "num_computed_prefill_tokens_np": arr([4, 0], np.int32, "numpy"),
                  "prefill_len_np": arr([4, 3], np.int32, "numpy"),
                  "has_prefill": FieldObs("scalar", "bool", (), True),
                  "decode_graph_eligible": FieldObs("scalar", "bool", (), False),
                  "num_draft_tokens": FieldObs("scalar", "int", (), 0),
                  "idx_mapping": arr([3, 1], np.int64), "expanded_idx_mapping": arr([3, 1], np.int64),
                  "cu_num_logits": arr([0, 1, 2], np.int32), "logits_indices": arr([0, 3], np.int64)}
        fields.update(over)
        return StageObs("prepare", fields=fields)

    assert check_batch_semantics(0, batch()) == []
    broken = {
        "query_start_loc": arr([0, 2, 4], np.int32),
        "seq_lens": arr([6, 4], np.int32),
        "positions": arr([0, 0, 0, 0], np.int64),
        "has_prefill": FieldObs("scalar", "bool", (), False),
        "decode_graph_eligible": FieldObs("scalar", "bool", (), True),
        "expanded_idx_mapping": arr([1, 3], np.int64),
        "logits_indices": arr([0, 9], np.int64),
    }
    for name, value in broken.items():
        got = {f.field for f in check_batch_semantics(0, batch(**{name: value}))}
        assert name in got, (name, got)


def test_contract_skips_fields_the_release_does_not_declare():
    """A field another release moved or lacks (0.31.0 has no InputBatch.pcp) is a release
    difference; a field the installed type declares but the observation lacks is a finding."""
    from simrig.reference.contract import BATCH_CONTRACT

    full = {name: arr([0], np.dtype(c.dtype), c.kind) for name, c in BATCH_CONTRACT.items()
            if not name.startswith("pcp.")}
    roots = frozenset(name.split(".")[0] for name in full)
    older = StageObs("prepare", fields=dict(full), declared=roots)
    assert [f for f in check_contract(0, older) if f.kind == fk.MISSING_FIELD] == []
    gone = dict(full)
    del gone["seq_lens"]
    declared_but_absent = StageObs("prepare", fields=gone, declared=roots)
    assert [f.field for f in check_contract(0, declared_but_absent)] == ["seq_lens"]
