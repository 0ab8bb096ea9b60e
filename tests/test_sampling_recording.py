"""Recorded and imported traces carry each request's sampling parameters.

vLLM's ``SamplingParams`` read back as a ``SamplingSpec`` (``simrig.vllm_sampling.from_vllm``),
field by field; the recorders (``simrig record``, the live hook) write the spec of each new
request the real scheduler hands on; ``--sampling-mix`` picks a request's spec by its id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

import pytest

from simrig.cli import main
from simrig.errors import UsageError
from simrig.sampling.params import SamplingSpec
from simrig.sources import live
from simrig.sources.record import real_scheduler, record, record_to_file
from simrig.sources.sampler import SyntheticSampler
from simrig.sources.workloads import SAMPLING_MIXES, WorkloadRequest, assign_sampling, sampling_of
from simrig.step import NewRequest, Step
from simrig.trace_io.trace import TraceReader, read_trace
from simrig.vllm_parts.scheduler import STOP_TOKEN_ID, SchedulerSetup
from simrig.vllm_sampling.from_vllm import recorded_spec, sampling_spec
from simrig.vllm_sampling.sampling_params import sampling_params

SETUP = SchedulerSetup(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=256, num_kv_blocks=64)
# one spec per field, each value one vLLM keeps as given (temperature stays above 0, so a
# top_k or top_p is not reset for greedy sampling)
ONE_FIELD = {
    "temperature": SamplingSpec(temperature=0.7),
    "top_k": SamplingSpec(top_k=5),
    "top_p": SamplingSpec(top_p=0.9),
    "min_p": SamplingSpec(min_p=0.1),
    "seed": SamplingSpec(seed=1234),
    "presence_penalty": SamplingSpec(presence_penalty=0.5),
    "frequency_penalty": SamplingSpec(frequency_penalty=-0.5),
    "repetition_penalty": SamplingSpec(repetition_penalty=1.1),
    "logit_bias": SamplingSpec(logit_bias=((3, -1.5), (17, 2.5))),
    "bad_words": SamplingSpec(bad_words=((5,), (7, 8))),
    "min_tokens": SamplingSpec(min_tokens=2),
    "stop_token_ids": SamplingSpec(stop_token_ids=(9, 11)),
    "logprobs": SamplingSpec(logprobs=5),
    "prompt_logprobs": SamplingSpec(prompt_logprobs=3),
}
EVERY_FIELD = SamplingSpec(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, seed=7, presence_penalty=0.2,
                           frequency_penalty=0.3, repetition_penalty=1.2, logit_bias=((4, 1.0),),
                           bad_words=((6, 7),), min_tokens=1, stop_token_ids=(12,), logprobs=2)


@pytest.fixture(scope="module")
def params_class():
    from simrig.vllm_runtime import platform  # lazy: vLLM loads only for the tests that need it

    platform.configure()
    from vllm.sampling_params import SamplingParams  # lazy: after platform.configure()

    return SamplingParams


def _params(params_class, spec: SamplingSpec):
    return sampling_params(params_class, spec, 16)


# ------------------------------------------------------------ the mapping
def test_one_field_specs_name_every_field():
    assert set(ONE_FIELD) == {f.name for f in fields(SamplingSpec)}
    assert all(not spec.is_default for spec in ONE_FIELD.values())


@pytest.mark.parametrize("name", sorted(ONE_FIELD))
def test_every_field_round_trips_through_sampling_params(params_class, name):
    spec = ONE_FIELD[name]
    assert sampling_spec(_params(params_class, spec)) == spec


def test_a_spec_of_every_field_round_trips(params_class):
    assert sampling_spec(sampling_params(params_class, EVERY_FIELD, 16)) == EVERY_FIELD
    greedy = SamplingSpec(temperature=0.0)
    assert sampling_spec(sampling_params(params_class, greedy, 16)) == greedy


def test_default_params_give_none(params_class):
    assert sampling_spec(params_class()) is None
    assert sampling_spec(params_class(max_tokens=5, ignore_eos=True)) is None
    assert sampling_spec(None) is None  # a pooling request has no SamplingParams


def test_the_recorders_stop_id_is_left_out(params_class):
    only_stop = params_class(max_tokens=5, stop_token_ids=[STOP_TOKEN_ID], ignore_eos=True)
    assert sampling_spec(only_stop, drop_stop_ids=(STOP_TOKEN_ID,)) is None
    both = params_class(max_tokens=5, stop_token_ids=[9, STOP_TOKEN_ID], temperature=0.5)
    assert sampling_spec(both, drop_stop_ids=(STOP_TOKEN_ID,)) == SamplingSpec(temperature=0.5,
                                                                               stop_token_ids=(9,))


def test_a_field_the_trace_cannot_hold_goes_back_to_its_default(params_class):
    params = params_class(max_tokens=5, temperature=0.5, logit_bias={5000: 1.0, 3: 1.0},
                          repetition_penalty=3.0, stop_token_ids=[9])
    assert recorded_spec(params, vocab_size=4096) == SamplingSpec(temperature=0.5, stop_token_ids=(9,))
    assert recorded_spec(params_class(max_tokens=5, stop_token_ids=[4096]), vocab_size=4096) is None
    assert recorded_spec(params_class(max_tokens=5, logprobs=20), vocab_size=4096) == SamplingSpec(logprobs=20)


# ------------------------------------------------------------ the recorders
@pytest.mark.vllm
def test_the_recorder_writes_the_spec_of_each_request_it_was_handed(tmp_path):
    handed = {"a": EVERY_FIELD, "b": SamplingSpec(temperature=0.0), "c": None}
    reqs = [WorkloadRequest(rid, 0.0, 12, 3, sampling=spec) for rid, spec in handed.items()]
    path = tmp_path / "t.jsonl"
    record_to_file(str(path), SETUP, reqs, spec="test", seed=0, acceptance_rate=0.7, eos_prob=0.0)
    header, steps = read_trace(path)
    written = {r.req_id: r.sampling for s in steps for r in s.new_requests}
    assert written == handed
    assert "sampling_mix" not in header.source


@pytest.mark.vllm
def test_record_with_a_mix_writes_each_requests_spec_and_names_the_mix(tmp_path):
    path = tmp_path / "mix.jsonl"
    assert main(["record", "--workload", "synthetic:requests=12,prompt=8-24,output=2-4", "--out", str(path),
                 "--sampling-mix", "chat", "--max-num-seqs", "4", "--num-kv-blocks", "64"]) == 0
    header, steps = read_trace(path)
    assert header.source["sampling_mix"] == "chat"
    written = {r.req_id: r.sampling for s in steps for r in s.new_requests}
    assert len(written) == 12
    assert written == {rid: sampling_of("chat", rid) for rid in written}
    assert {spec.temperature for spec in written.values()} == {0.0, 0.7}  # greedy and sampled ones


@pytest.mark.vllm
def test_the_live_hook_writes_each_new_requests_spec(tmp_path):
    scheduler = real_scheduler(SETUP)
    recorder = live.recorder_for(scheduler.scheduler, str(tmp_path))
    live.attach(scheduler.scheduler, recorder)
    handed = {"x": SamplingSpec(top_k=3, seed=5), "y": None}
    reqs = [WorkloadRequest(rid, 0.0, 10, 2, sampling=spec) for rid, spec in handed.items()]
    sampler = SyntheticSampler(seed=0, stop_token_id=STOP_TOKEN_ID)
    record(scheduler, reqs, sampler, lambda step: None)
    live.detach(scheduler.scheduler)
    (part,) = tmp_path.glob("sched-*.jsonl.gz")
    assert {r.req_id: r.sampling for _, s in TraceReader(part) for r in s.new_requests} == handed


def test_a_live_resync_step_re_sends_each_requests_spec():
    mirror = live.RunnerMirror()
    spec = SamplingSpec(temperature=0.3)
    mirror.apply(Step(new_requests=[NewRequest("r", 8, sampling=spec), NewRequest("s", 8)],
                      num_scheduled_tokens={"r": 4, "s": 4}))
    assert {r.req_id: r.sampling for r in mirror.resync_step().new_requests} == {"r": spec, "s": None}


# ------------------------------------------------------------ the mixes
def test_a_mix_picks_by_request_id_alone():
    ids = [f"req-{i}" for i in range(200)]
    first = [sampling_of("chat", rid) for rid in ids]
    assert [sampling_of("chat", rid) for rid in reversed(ids)] == first[::-1]
    reqs = [WorkloadRequest(rid, 0.0, 8, 4) for rid in ids[::3]]
    assign_sampling(reqs, "chat")
    assert [r.sampling for r in reqs] == first[::3]


def test_the_chat_mix_holds_the_shares_the_docs_state():
    counts = Counter(sampling_of("chat", f"req-{i}") for i in range(10_000))
    docs = {SamplingSpec(temperature=0.7, top_p=0.95): 0.60, SamplingSpec(temperature=0.0): 0.20,
            SamplingSpec(temperature=0.7, top_p=0.95, repetition_penalty=1.1): 0.10,
            SamplingSpec(temperature=0.7, top_p=0.95, logprobs=5): 0.10}
    assert set(counts) == set(docs)
    for spec, share in docs.items():
        assert abs(counts[spec] / 10_000 - share) < 0.015, (spec, counts[spec])
    assert {spec: percent / 100 for percent, spec in SAMPLING_MIXES["chat"]} == docs


def test_greedy_none_and_an_unknown_mix():
    reqs = [WorkloadRequest(f"q{i}", 0.0, 8, 4) for i in range(20)]
    assign_sampling(reqs, "none")
    assert {r.sampling for r in reqs} == {None}
    assign_sampling(reqs, "greedy")
    assert {r.sampling for r in reqs} == {SamplingSpec(temperature=0.0)}
    with pytest.raises(UsageError, match="--sampling-mix: unknown mix 'warm'"):
        assign_sampling(reqs, "warm")
    assert all(sum(p for p, _ in mix) == 100 for mix in SAMPLING_MIXES.values())
