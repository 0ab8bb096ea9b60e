"""Per-request sampling parameters: ``SamplingSpec``'s JSON form and bounds, the trace's
``new_requests[i].sampling`` object (read, refused naming file, line and field, written),
the bundled traces unchanged, and the strategies that draw specs (no vLLM needed)."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from simrig.sampling.params import SamplingSpec, SamplingSpecError
from simrig.step import SYNTH_VOCAB_SIZE, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceError, TraceHeader, read_trace, trace_files_in, write_trace
from strategies import new_requests, sampling_specs, scheduled_runs, scheduler_steps
from strategies.model import STREAMED, Plan, Row, SchedulerModel

ROOT = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))

# Every field away from its default.
FULL = SamplingSpec(temperature=0.5, top_k=40, top_p=0.9, min_p=0.05, seed=2**62, presence_penalty=-1.5,
                    frequency_penalty=2.0, repetition_penalty=1.25, logit_bias=((3, -100.0), (17, 2.5)),
                    bad_words=((5,), (6, 7, 8)), min_tokens=2, stop_token_ids=(9, 4),
                    logprobs=-1, prompt_logprobs=20)
FULL_JSON = {"temperature": 0.5, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 4611686018427387904,
             "presence_penalty": -1.5, "frequency_penalty": 2.0, "repetition_penalty": 1.25,
             "logit_bias": {"3": -100.0, "17": 2.5}, "bad_words": [[5], [6, 7, 8]], "min_tokens": 2,
             "stop_token_ids": [9, 4], "logprobs": -1, "prompt_logprobs": 20}
CONFIG = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=32, max_model_len=64)


def test_every_field_round_trips_through_json():
    assert FULL.to_json() == FULL_JSON
    assert list(FULL.to_json()) == list(FULL_JSON)  # the dataclass's field order
    assert SamplingSpec.from_json(FULL_JSON) == FULL
    assert SamplingSpec.from_json(json.loads(json.dumps(FULL.to_json()))) == FULL
    assert not FULL.is_default


def test_defaults_are_omitted_and_null_is_the_default_where_the_default_is_none():
    assert SamplingSpec().to_json() == {} and SamplingSpec().is_default
    assert SamplingSpec(top_p=0.5, seed=0).to_json() == {"top_p": 0.5, "seed": 0}
    assert SamplingSpec(logprobs=0).to_json() == {"logprobs": 0}
    assert SamplingSpec.from_json({"seed": None, "logprobs": None}).is_default
    assert SamplingSpec.from_json({"temperature": 0}) == SamplingSpec(temperature=0.0)
    assert SamplingSpec.from_json({"logit_bias": {"17": 2, "3": 1.5}}).logit_bias == ((3, 1.5), (17, 2.0))


def _trace(tmp_path: Path, steps: list[Step]) -> Path:
    path = tmp_path / "t.jsonl"
    write_trace(path, TraceHeader(config=CONFIG), steps)
    return path


def test_every_field_round_trips_through_a_trace_file(tmp_path):
    steps = [Step(new_requests=[NewRequest("a", 4, max_tokens=3, sampling=FULL),
                                NewRequest("b", 4, sampling=SamplingSpec()),
                                NewRequest("c", 4, sampling=SamplingSpec(temperature=0.0)),
                                NewRequest("d", 4)],
                  num_scheduled_tokens={"a": 4, "b": 4, "c": 4, "d": 4})]
    path = _trace(tmp_path, steps)
    assert read_trace(path)[1] == steps
    written = json.loads(path.read_text().splitlines()[1])["new_requests"]
    assert [r.get("sampling", "absent") for r in written] == [FULL_JSON, {}, {"temperature": 0.0}, "absent"]


# (the sampling object, the field named after new_requests[0].sampling, the problem)
REFUSED = [
    ({"temperature": -1}, "temperature", "must be in [0, 2], got -1.0"),
    ({"temperature": 2.5}, "temperature", "must be in [0, 2], got 2.5"),
    ({"top_p": 0}, "top_p", "must be in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "top_p", "must be in (0, 1], got 1.5"),
    ({"top_k": -2}, "top_k", "must be in [-1, 2147483647], got -2"),
    ({"top_k": 1.5}, "top_k", "must be an integer, got float 1.5"),
    ({"min_p": 1.5}, "min_p", "must be in [0, 1], got 1.5"),
    ({"min_p": float("nan")}, "min_p", "must be a finite number in [0, 1], got nan"),
    ({"temperature": float("inf")}, "temperature", "must be a finite number in [0, 2], got inf"),
    ({"temperature": None}, "temperature", "must be a number, got NoneType None"),
    ({"temperature": True}, "temperature", "must be a number, got bool True"),
    ({"presence_penalty": -2.5}, "presence_penalty", "must be in [-2, 2], got -2.5"),
    ({"frequency_penalty": 3}, "frequency_penalty", "must be in [-2, 2], got 3.0"),
    ({"repetition_penalty": 0}, "repetition_penalty", "must be in (0, 2], got 0.0"),
    ({"repetition_penalty": 2.5}, "repetition_penalty", "must be in (0, 2], got 2.5"),
    ({"seed": 2**63}, "seed", f"must be in [{-2**63}, {2**63 - 1}], got {2**63}"),
    ({"seed": -1}, "seed", "-1 is vLLM's spelling of no seed: leave seed out"),
    ({"logit_bias": {"4096": 1.0}}, "logit_bias.4096", "must be a token id in [0, 4096), got 4096"),
    ({"logit_bias": {"17": 101}}, "logit_bias.17", "must be in [-100, 100], got 101.0"),
    ({"logit_bias": {"017": 1}}, "logit_bias.017", "the key must be a token id in decimal digits"),
    ({"logit_bias": [[17, 1]]}, "logit_bias", "must be an object token id -> bias, got list"),
    ({"bad_words": [[]]}, "bad_words[0]", "must hold at least one token id (vLLM: \"bad_words entries "
                                          "must tokenize to at least one token\")"),
    ({"bad_words": [[1, 5000]]}, "bad_words[0][1]", "must be a token id in [0, 4096), got 5000"),
    ({"bad_words": [[1], [1]]}, "bad_words[1]", "repeats bad word 0"),
    ({"stop_token_ids": [4096]}, "stop_token_ids[0]", "must be a token id in [0, 4096), got 4096"),
    ({"stop_token_ids": [3, 3]}, "stop_token_ids[1]", "repeats token id 3"),
    ({"stop_token_ids": list(range(129))}, "stop_token_ids", "holds 129 token ids, at most 128"),
    ({"min_tokens": -1}, "min_tokens", "must be in [0, 2147483647], got -1"),
    ({"min_tokens": 4}, "min_tokens", "4 exceeds the request's max_tokens 3"),
    ({"logprobs": 21}, "logprobs", "must be in [-1, 20], got 21"),
    ({"logprobs": -2}, "logprobs", "must be in [-1, 20], got -2"),
    ({"prompt_logprobs": 21}, "prompt_logprobs", "must be in [-1, 20], got 21"),
    ({"top_q": 1, "n": 2}, "n", "unknown field (also top_q)"),
]


@pytest.mark.parametrize("raw, field, problem", REFUSED, ids=[f"{i}-{f}" for i, (_, f, _) in enumerate(REFUSED)])
def test_every_bound_is_refused_naming_its_field(tmp_path, raw, field, problem):
    where = "new_requests[0].sampling"
    with pytest.raises(SamplingSpecError) as err:
        SamplingSpec.from_json(raw, where=where, vocab_size=SYNTH_VOCAB_SIZE, max_tokens=3)
    assert (err.value.field, err.value.problem) == (f"{where}.{field}", problem)
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(TraceHeader(config=CONFIG).to_json()) + "\n" + json.dumps(
        {"new_requests": [{"id": "a", "prompt_len": 4, "max_tokens": 3, "sampling": raw}],
         "num_scheduled_tokens": {"a": 4}}) + "\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == f"{path}:2: {where}.{field}: {problem}"


def test_a_sampling_value_that_is_not_an_object_is_refused(tmp_path):
    with pytest.raises(SamplingSpecError, match=r"^sampling: must be an object, got list$"):
        SamplingSpec.from_json([])


def test_replay_refuses_a_bad_sampling_value_in_one_line_exit_2(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps(TraceHeader(config=CONFIG).to_json()) + "\n" + json.dumps(
        {"new_requests": [{"id": "a", "prompt_len": 4, "sampling": {"top_p": 1.5}}],
         "num_scheduled_tokens": {"a": 4}}) + "\n")
    env = {**os.environ, "SIMRIG_HISTORY": str(tmp_path / "history"), "PYTHONWARNINGS": "ignore"}
    env.pop("SIMRIG_KNOWN", None)
    proc = subprocess.run([sys.executable, "-m", "simrig", "replay", "--no-coverage", str(trace), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"simrig replay: error: {trace}:2: new_requests[0].sampling.top_p: must be in (0, 1], got 1.5"]
    assert not (tmp_path / "out").exists()


def test_the_bundled_traces_read_and_write_as_before(tmp_path):
    """Only the bundled sampling samples (traces/samples/sampling_*) have sampling objects:
    every other trace reads without one and writes back unchanged (the recorded and
    regression traces, written by the writer, byte for byte; the hand-written samples, which
    leave defaults out, as a fixed point of the writer); every trace is such a fixed point."""
    paths = [p for d in ("samples", "recorded", "regressions") for p in trace_files_in(ROOT / "traces" / d)]
    assert len(paths) >= 15
    for path in paths:
        header, steps = read_trace(path)
        sampled = path.name.startswith("sampling_")
        assert any(r.sampling is not None for s in steps for r in s.new_requests) == sampled, path
        out = tmp_path / f"{path.parent.name}-{path.name.removesuffix('.gz')}"
        write_trace(out, header, steps)
        text = out.read_bytes()
        if "samples" not in path.parts:
            raw = path.read_bytes()
            assert text == (gzip.decompress(raw) if path.name.endswith(".gz") else raw), path
        assert (b"sampling" in text) == sampled
        again = read_trace(out)
        write_trace(out, *again)
        assert out.read_bytes() == text and again == (header, steps), path


# ------------------------------------------------------------------ the strategies
@FAST
@given(sampling_specs())
def test_drawn_specs_always_validate(spec):
    spec.check(vocab_size=SYNTH_VOCAB_SIZE)
    assert SamplingSpec.from_json(spec.to_json(), vocab_size=SYNTH_VOCAB_SIZE) == spec
    assert SamplingSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


@FAST
@given(sampling_specs(vocab_size=8, max_families=11))
def test_every_family_at_once_stays_inside_a_small_vocabulary(spec):
    spec.check(vocab_size=8)


@pytest.mark.parametrize("field", list(FULL_JSON))
def test_every_field_leaves_its_default_in_some_draw(field):
    found = find(sampling_specs(), lambda spec: field in spec.to_json(), random=random.Random(0),
                 settings=settings(max_examples=2000, database=None, deadline=None, phases=[Phase.generate]))
    assert field in found.to_json()


@FAST
@given(scheduled_runs(config=st.just(CONFIG), max_steps=12))
def test_drawn_steps_carry_specs_that_read_back_and_resends_carry_the_first(tmp_path_factory, run):
    config, steps = run
    first: dict[str, SamplingSpec | None] = {}
    for step in steps:
        for req in step.new_requests:
            if req.sampling is not None:
                assert req.sampling.min_tokens <= req.max_tokens
            assert first.setdefault(req.req_id, req.sampling) == req.sampling  # resumed, streamed
    path = tmp_path_factory.mktemp("run") / "t.jsonl"
    write_trace(path, TraceHeader(config=config), steps)
    assert read_trace(path)[1] == steps


@FAST
@given(new_requests(sampling=st.just(SamplingSpec(min_tokens=4)), max_new_tokens=2))
def test_a_requests_min_tokens_is_lowered_to_its_max_tokens(req):
    assert req.sampling.min_tokens == req.max_tokens


@FAST
@given(scheduler_steps(config=st.just(CONFIG), sampling=st.none()))
def test_sampling_none_sends_vllms_defaults(steps):
    assert all(r.sampling is None for s in steps for r in s.new_requests)


def test_a_preempted_request_and_a_streaming_update_carry_the_spec_they_arrived_with():
    spec = SamplingSpec(temperature=0.0, min_tokens=2)
    model = SchedulerModel(CONFIG)
    a = model.arrive(5, 3, sampling=spec)
    assert model.build_step(Plan([Row(a, 5)])).new_requests[0].sampling == spec
    model.preempt(a)
    model.build_step(Plan([]))
    model.resume(a, 0)
    (resent,) = model.build_step(Plan([Row(a, 6)])).new_requests
    assert resent.prefill_len == 6 and resent.sampling == spec
    model.stream_input(a, 2, 3, stop_now=True)
    assert model.reqs[a].state == STREAMED
    (update,) = model.build_step(Plan([Row(a, 2)])).new_requests
    assert update.streaming and update.sampling == spec
    with pytest.raises(ValueError, match="min_tokens 2 exceeds max_tokens 1"):
        model.arrive(5, 1, sampling=spec)


@pytest.mark.parametrize("build, message", [
    (lambda: sampling_specs(vocab_size=0), "vocab_size=0"),
    (lambda: sampling_specs(max_families=12), "max_families=12"),
    (lambda: new_requests(sampling=SamplingSpec()), "sampling="),
    (lambda: scheduler_steps(sampling="x"), "sampling='x'"),
    (lambda: scheduled_runs(sampling=3), "sampling=3"),
])
def test_bad_sampling_arguments_raise_invalid_argument(build, message):
    with pytest.raises(InvalidArgument, match=message):
        build()
