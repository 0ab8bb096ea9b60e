"""Cudagraph-padded steps through the real runner, and the checks that judge them.

Expected values are written from the descriptor's meaning (BatchExecutionDescriptor,
the cudagraph modes) and the capture sizes chosen here, never read off a run.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simrig.observe import FieldObs, StageObs, StepObs
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step


def _steps() -> list[Step]:
    """Two prompts (5 and 3 tokens), then two 1-token decodes, then a third prompt."""
    return [Step(new_requests=[NewRequest("a", 5), NewRequest("b", 3)], num_scheduled_tokens={"a": 5, "b": 3}),
            Step(cached=[CachedUpdate("a", 5), CachedUpdate("b", 3)], num_scheduled_tokens={"a": 1, "b": 1}),
            Step(new_requests=[NewRequest("c", 9)], cached=[CachedUpdate("a", 6), CachedUpdate("b", 4)],
                 num_scheduled_tokens={"a": 1, "b": 1, "c": 9})]


def _run(config: RunnerConfig) -> tuple[list[StepObs], list]:
    from simrig.checks.checker import Checker
    from simrig.harness import Harness

    harness, checker = Harness(config), Checker(config)
    observations, findings = [], []
    for i, step in enumerate(_steps()):
        obs = harness.run_step(step)
        observations.append(obs)
        findings += [f for f in checker.check(i, step, obs) if not f.known]
    return observations, findings


def _desc(obs: StepObs) -> tuple:
    d = obs.get("dispatch").fields
    return tuple(d[k].values for k in ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count"))


def _values(obs: StepObs, stage: str, name: str):
    return obs.get(stage).fields[name].values


@pytest.mark.vllm
def test_full_and_piecewise_pads_through_prepare_and_the_dummy(vllm_api):
    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128,
                          cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(4, 16))
    observations, findings = _run(config)
    assert findings == []
    prefill, decode, mixed = observations
    # 8 prompt tokens: the PIECEWISE graph for 16 tokens, requests unpadded
    assert _desc(prefill) == ("PIECEWISE", 16, None, None)
    assert _values(prefill, "prepare", "num_tokens_after_padding") == 16
    assert _values(prefill, "prepare", "input_ids").shape == (16,)
    # two 1-token decodes: the FULL uniform-decode graph for 4 tokens = 4 requests
    assert _desc(decode) == ("FULL", 4, 4, 1)
    assert _values(decode, "prepare", "num_reqs_after_padding") == 4
    assert _values(decode, "prepare", "query_start_loc").tolist() == [0, 1, 2, 2, 2]
    assert _values(decode, "prepare", "seq_lens").tolist() == [6, 4, 0, 0]
    # the dummy is the batch that graph was captured with: 4 requests of 1 token
    assert _values(decode, "dummy", "num_scheduled_tokens").tolist() == [1, 1, 1, 1]
    # 11 tokens with a prefill: PIECEWISE 16 again
    assert _desc(mixed) == ("PIECEWISE", 16, None, None)
    # the first step also builds every capture dummy: FULL decode 4, PIECEWISE 16 and 4
    captures = [s for s in prefill.stages if s.stage == "capture"]
    assert sorted((s.fields["desc.cg_mode"].values, s.fields["desc.num_tokens"].values) for s in captures) \
        == [("FULL", 4), ("PIECEWISE", 4), ("PIECEWISE", 16)]


@pytest.mark.vllm
def test_every_mode_runs_clean_with_pcp_and_every_dcp_rank(vllm_api):
    for mode in ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128,
                              cudagraph_mode=mode, pcp_size=2, dcp_size=2)
        observations, findings = _run(config)
        assert findings == [], mode
        parts = [(s.rank, s.dcp_rank) for s in observations[0].stages if s.stage == "partition"]
        assert sorted(parts) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def _graph_step() -> tuple[RunnerConfig, Step, StepObs]:
    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128,
                          cudagraph_mode="FULL_DECODE_ONLY", capture_sizes=(4,))
    return config, _steps()[1], StepObs(index=1)


def _stage(name: str, **fields) -> StageObs:
    def obs(v):
        if isinstance(v, np.ndarray):
            return FieldObs("numpy", v.dtype.name, v.shape, v)
        return FieldObs("none", "", (), None) if v is None else FieldObs("scalar", type(v).__name__, (), v)
    return StageObs(stage=name, fields={k: obs(v) for k, v in fields.items()})


def test_dispatch_rules_name_each_broken_promise():
    from simrig.graph_rules.padding import check_dispatch

    config, _, _ = _graph_step()
    q, pref = np.array([1, 1]), np.array([False, False])
    decode = np.array([True, True])

    def kinds(**desc):
        base = dict(cg_mode="FULL", num_tokens=4, num_reqs=4, uniform_token_count=1, max_query_len=None)
        base.update(desc)
        return sorted((f.field, f.message.split(":")[0]) for f in check_dispatch(1, config, base, q, pref, decode))

    assert kinds() == []
    assert [f for f, _ in kinds(num_tokens=1)] == ["num_tokens", "num_tokens"]  # too small, not a capture size
    assert [f for f, _ in kinds(cg_mode="NONE", num_tokens=2, num_reqs=2, uniform_token_count=None)] \
        == ["cg_mode"]  # eager although the 4-token decode graph fits
    assert [f for f, _ in kinds(uniform_token_count=2, num_reqs=2)] == ["uniform_token_count"]
    # PIECEWISE is never captured under FULL_DECODE_ONLY, and the decode batch fits a FULL graph
    assert [f for f, _ in kinds(cg_mode="PIECEWISE", num_reqs=None, uniform_token_count=None)] == \
        ["cg_mode", "cg_mode"]
    # a prefill batch may not replay a decode graph
    prefill = check_dispatch(1, config, dict(cg_mode="FULL", num_tokens=4, num_reqs=4, uniform_token_count=1,
                                             max_query_len=None), np.array([3]), np.array([True]),
                             np.array([False]))
    assert [f.field for f in prefill] == ["uniform_token_count"]


def test_capture_dummy_must_match_its_descriptor():
    from simrig.graph_rules.padding import check_capture

    config, _, _ = _graph_step()
    good = _stage("capture", **{"desc.cg_mode": "FULL", "desc.num_tokens": 4, "desc.num_reqs": 2,
                                "desc.uniform_token_count": 2, "desc.max_query_len": None,
                                "num_tokens_after_padding": 4,
                                "num_scheduled_tokens": np.array([2, 2], dtype=np.int32)})
    assert check_capture(0, config, good) == []
    uneven = dataclasses.replace(good, fields={**good.fields, "num_scheduled_tokens": FieldObs(
        "numpy", "int32", (2,), np.array([1, 3], dtype=np.int32))})
    assert [f.field for f in check_capture(0, config, uneven)] == ["num_scheduled_tokens", "num_scheduled_tokens"]


def test_parity_compares_graph_shapes_with_the_capture_dummy():
    from simrig.checks.parity import check_parity

    real = _stage("prepare", query_start_loc=np.zeros(5, dtype=np.int32), input_ids=np.zeros(4, dtype=np.int32),
                  num_draft_tokens=0)
    captured = _stage("capture", query_start_loc=np.zeros(3, dtype=np.int32),
                      input_ids=np.zeros(4, dtype=np.int32))
    # the step's own dummy run went elsewhere (another descriptor): only dtypes compared
    dummy_run = _stage("dummy", query_start_loc=np.zeros(9, dtype=np.int32),
                       input_ids=np.zeros(8, dtype=np.int32))
    full = dict(cg_mode="FULL", num_tokens=4, num_reqs=2, uniform_token_count=None, max_query_len=None)
    found = check_parity(1, real, dummy_run, full, None, captured)
    assert [(f.field, f.expected, f.actual) for f in found] == [("query_start_loc", "shape (3,)", "shape (5,)")]
    # a PIECEWISE graph pads no requests: request-shaped fields may differ
    assert check_parity(1, real, dummy_run, dict(full, cg_mode="PIECEWISE", num_reqs=None), None,
                        captured) == []
    # no capture dummy known and the dummy run at another descriptor: nothing to hold shapes to
    assert check_parity(1, real, dummy_run, full) == []


def test_dcp_peer_that_differs_is_a_finding():
    from simrig.partition.pcp import check_dcp_peers

    a = _stage("partition", seq_lens=np.array([3, 4], dtype=np.int32))
    b = _stage("partition", seq_lens=np.array([3, 5], dtype=np.int32))
    a.rank = b.rank = 1
    b.dcp_rank = 1
    obs = StepObs(index=0, stages=[a, b])
    found = check_dcp_peers(0, obs)
    assert [(f.field, f.rank) for f in found] == [("seq_lens", 1)]
    b.fields = dict(a.fields)
    assert check_dcp_peers(0, obs) == []


def test_graph_config_is_validated_with_the_field_named(tmp_path):
    import json

    from simrig.trace_io.trace import TraceError, read_trace

    with pytest.raises(ValueError, match="FULL is refused with PCP"):
        RunnerConfig(pcp_size=2, cudagraph_mode="FULL").validate()
    with pytest.raises(ValueError, match="varlen_decode"):
        RunnerConfig(cudagraph_mode="PIECEWISE", varlen_decode=True).validate()
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"format": "simrig-trace", "version": 1, "source": {},
                                "config": {"cudagraph_mode": "FAST"}}) + "\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert "bad.jsonl:1: config.cudagraph_mode:" in str(err.value)
    path.write_text(json.dumps({"format": "simrig-trace", "version": 1, "source": {},
                                "config": {"cudagraph_mode": "PIECEWISE", "capture_sizes": [0]}}) + "\n")
    with pytest.raises(TraceError, match="config.capture_sizes"):
        read_trace(path)


def test_graph_fields_round_trip_and_eager_headers_stay_as_before(tmp_path):
    from simrig.trace_io.trace import TraceHeader, read_trace, write_trace

    graph = RunnerConfig(cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(2, 8), varlen_decode=True)
    write_trace(tmp_path / "g.jsonl", TraceHeader(config=graph), [])
    assert read_trace(tmp_path / "g.jsonl")[0].config == graph
    write_trace(tmp_path / "e.jsonl", TraceHeader(config=RunnerConfig()), [])
    header = (tmp_path / "e.jsonl").read_text().splitlines()[0]
    assert "cudagraph_mode" not in header and "capture_sizes" not in header


@pytest.mark.vllm
def test_replay_under_another_cudagraph_mode(vllm_api, tmp_path, capsys):
    import pandas as pd

    from simrig.cli import main

    out = tmp_path / "rep"
    status = main(["replay", "--no-coverage", "traces/samples/spec_decode.jsonl", "--cudagraph-mode", "full_and_piecewise",
                   "--out", str(out), "--quiet"])
    assert status == 0, capsys.readouterr().out
    stages = set(pd.read_parquet(out / "steps.parquet")["stage"])
    assert {"dispatch", "capture"} <= stages
    status = main(["replay", "--no-coverage", "traces/samples/pcp2.jsonl", "--cudagraph-mode", "FULL", "--out",
                   str(tmp_path / "no"), "--quiet"])
    assert status == 2 and not (tmp_path / "no").exists()
    assert "FULL is refused with PCP" in capsys.readouterr().err


@pytest.mark.parametrize("pcp, shard", [(1, False), (2, False), (2, True)])
def test_full_and_piecewise_decode_sent_to_piecewise_is_flagged(pcp, shard):
    """CompilationConfig: FULL_AND_PIECEWISE runs "full cudagraph for decode batches": a
    decode batch (under PCP: its largest rank-local batch) that fits a FULL decode graph
    may not run PIECEWISE; a prefill batch may."""
    from simrig.graph_rules.padding import check_dispatch

    config = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=64, max_model_len=128,
                          cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(4,), pcp_size=pcp,
                          shard_decode_requests=shard)
    q, decode = np.array([1, 1]), np.array([False, False])
    piecewise = dict(cg_mode="PIECEWISE", num_tokens=4, num_reqs=None, uniform_token_count=None,
                     max_query_len=None)
    found = check_dispatch(1, config, piecewise, q, decode, np.array([True, True]))
    assert [(f.field, f.expected, f.actual) for f in found] == [("cg_mode", "FULL", "PIECEWISE")]
    full = dict(cg_mode="FULL", num_tokens=4, num_reqs=4, uniform_token_count=1, max_query_len=None)
    assert check_dispatch(1, config, full, q, decode, np.array([True, True])) == []
    prefill = check_dispatch(1, config, piecewise, np.array([3]), np.array([True]), np.array([False]))
    assert prefill == []


def test_capture_request_count_follows_the_descriptor_meaning_not_a_formula():
    """FULL: exactly desc.num_reqs requests; PIECEWISE (num_reqs None): any non-empty split the
    runner admits, so a change in how vLLM splits its capture dummy is not a finding."""
    from simrig.graph_rules.padding import check_capture

    config, _, _ = _graph_step()

    def capture(mode, n_req, q):
        return _stage("capture", **{"desc.cg_mode": mode, "desc.num_tokens": 4, "desc.num_reqs": n_req,
                                    "desc.uniform_token_count": None, "desc.max_query_len": None,
                                    "num_tokens_after_padding": 4,
                                    "num_scheduled_tokens": np.array(q, dtype=np.int32)})

    assert check_capture(0, config, capture("PIECEWISE", None, [4])) == []
    assert check_capture(0, config, capture("PIECEWISE", None, [1, 1, 2])) == []
    assert [f.field for f in check_capture(0, config, capture("FULL", 4, [2, 2]))] == ["num_reqs"]
    assert check_capture(0, config, capture("FULL", 2, [2, 2])) == []
