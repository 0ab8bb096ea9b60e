"""Structured output: a step's ``grammar`` read and bounded like every other field, packed as
vLLM's bitmask, masked first by the reference, and judged per request by the grammar rule
(``simrig/sampling_checks/grammar.py``); the bundled grammar trace samples every grammar
request's token inside its set on the real sampler."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simrig.observe import POSTPROCESS, FieldObs, StageObs, StepObs
from simrig.sampling.logits import SAMPLER_ENV, spread_logits, spreads
from simrig.sampling.params import SamplingSpec
from simrig.sampling.processing import expected_row
from simrig.sampling_checks.oracle import SamplingOracle
from simrig.step import NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceError, TraceHeader, read_trace, write_trace
from simrig.vllm_sampling.bitmask import pack_bitmask
from simrig.vllm_sampling.switch import SampledRows

RIG = Path(__file__).resolve().parents[1]
SAMPLE = RIG / "traces" / "samples" / "sampling_grammar.jsonl"
VOCAB = 16


# ------------------------------------------------------------------ the trace field
def _steps() -> list[Step]:
    return [Step(new_requests=[NewRequest("a", 4, structured_output=True), NewRequest("b", 6),
                               NewRequest("c", 3, structured_output=True, sampling=SamplingSpec(top_k=5))],
                 num_scheduled_tokens={"a": 4, "b": 6, "c": 3}, grammar={"c": (7,), "a": (0, 31, 4095)})]


def test_grammar_round_trips_in_the_schedulers_order(tmp_path):
    path = tmp_path / "g.jsonl"
    write_trace(path, TraceHeader(), _steps())
    line = json.loads(path.read_text().splitlines()[1])
    assert list(line["grammar"]) == ["c", "a"] and line["grammar"]["a"] == [0, 31, 4095]
    assert [r.get("structured_output") for r in line["new_requests"]] == [True, None, True]
    _, steps = read_trace(path)
    assert steps == _steps() and list(steps[0].grammar) == ["c", "a"]


def test_a_trace_without_grammar_writes_no_new_key(tmp_path):
    path = tmp_path / "plain.jsonl"
    write_trace(path, TraceHeader(), [Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})])
    assert "grammar" not in path.read_text() and "structured_output" not in path.read_text()


def _bad(tmp_path: Path, edit, config: dict | None = None) -> str:
    path = tmp_path / "bad.jsonl"
    write_trace(path, TraceHeader(), _steps())
    header, line = (json.loads(text) for text in path.read_text().splitlines())
    header["config"].update(config or {})
    edit(line)
    path.write_text(json.dumps(header) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(TraceError) as exc:
        read_trace(path)
    return str(exc.value).split("bad.jsonl:", 1)[1]


@pytest.mark.parametrize("edit, expected", [
    (lambda s: s["grammar"].update(a=[]), "2: grammar.a: must be a non-empty list"),
    (lambda s: s["grammar"].update(a=[3, 3]), "2: grammar.a[1]: token ids must ascend, each once"),
    (lambda s: s["grammar"].update(a=[5, 2]), "2: grammar.a[1]: token ids must ascend"),
    (lambda s: s["grammar"].update(a=[4096]), "2: grammar.a[0]: must be a token id in [0, 4096), got 4096"),
    (lambda s: s["grammar"].update(a=[-1]), "2: grammar.a[0]: must be a token id in [0, 4096)"),
    (lambda s: s["grammar"].update(a=[True]), "2: grammar.a[0]: must be a token id in [0, 4096), got True"),
    (lambda s: s["grammar"].update(a=7), "2: grammar.a: must be a non-empty list"),
    (lambda s: s.update(grammar=[1]), "2: grammar: must be an object, got list"),
    (lambda s: s["grammar"].update(z=[1]), "2: grammar.z: request is not scheduled in this step"),
    (lambda s: s["grammar"].update(b=[1]), "2: grammar.b: request 'b' is not a held structured-output request"),
    (lambda s: s["new_requests"][0].update(structured_output=1),
     "2: new_requests[0].structured_output: must be true or false, got 1"),
])
def test_a_bad_grammar_is_one_line_naming_its_field(tmp_path, edit, expected):
    assert _bad(tmp_path, edit).startswith(expected)


def test_structured_output_under_drafts_needs_a_greedy_request_and_vllms_verifier(tmp_path):
    problem = _bad(tmp_path, lambda s: None, {"num_speculative_tokens": 2})
    assert problem.startswith("2: new_requests[0].structured_output: structured output under speculative "
                              "decoding (config.num_speculative_tokens is 2) needs a greedy request "
                              "(sampling.temperature 0) verified by vLLM's rejection sampler")
    greedy = lambda s: s["new_requests"][0].update(sampling={"temperature": 0.0})  # noqa: E731
    assert _bad(tmp_path, greedy, {"num_speculative_tokens": 2}).startswith(
        "2: new_requests[0].structured_output: structured output under speculative decoding")


def test_a_released_request_loses_its_grammar(tmp_path):
    path = tmp_path / "released.jsonl"
    write_trace(path, TraceHeader(), [*_steps(), Step(finished=["a"], cached=[], num_scheduled_tokens={})])
    lines = path.read_text().splitlines()
    step = json.loads(lines[1])
    step.update(step=1, new_requests=[{"id": "a", "prompt_len": 4}], grammar={"a": [1]},
                num_scheduled_tokens={"a": 4}, finished=["a"])
    path.write_text("\n".join([*lines[:2], json.dumps(step)]) + "\n")
    with pytest.raises(TraceError, match=r":3: grammar\.a: request 'a' is not a held structured-output"):
        read_trace(path)


def test_a_bad_grammar_on_the_command_line_is_exit_2_and_one_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_trace(path, TraceHeader(), _steps())
    header, line = path.read_text().splitlines()
    path.write_text(header + "\n" + line.replace('"a":[0,31,4095]', '"a":[0,31,31]') + "\n")
    proc = subprocess.run([sys.executable, "-m", "simrig", "replay", "--no-coverage", str(path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, cwd=RIG)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("bad.jsonl:2: grammar.a[2]: token ids must ascend, "
                                                         "each once (31 after 31)"), proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ the bitmask
def test_the_bitmask_packs_bit_j_of_word_w_as_token_32w_plus_j():
    # 70 tokens: 3 words a row; token 0 is bit 0 of word 0, 31 its sign bit, 32 bit 0 of word 1,
    # 69 bit 5 of word 2
    packed = pack_bitmask([[0, 31, 32, 69], [5]], 70)
    assert packed.dtype == np.int32 and packed.shape == (2, 3)
    assert packed.tolist() == [[-(2**31) + 1, 1, 32], [32, 0, 0]]
    assert pack_bitmask([range(64)], 64).tolist() == [[-1, -1]]  # every bit: vLLM's all-permissive row


# ------------------------------------------------------------------ the reference
def test_the_reference_masks_the_row_before_the_samplers_processing():
    logits = np.array([1.0, 5.0, 3.0, 4.0, -2.0])
    row = expected_row(SamplingSpec(logit_bias=((1, 10.0), (4, 10.0))), logits, [], [], allowed=(0, 2, 4))
    assert row.values.tolist() == [1.0, -np.inf, 3.0, -np.inf, 8.0]  # a bias cannot lift a masked token
    greedy = expected_row(SamplingSpec(temperature=0.0), logits, [], [], allowed=(0, 2))
    assert int(np.argmax(greedy.values)) == 2 and greedy.greedy
    assert expected_row(None, logits, [], []).values.tolist() == logits.tolist()


def test_a_structured_request_spreads_like_one_with_parameters(monkeypatch):
    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    assert spreads(None, 0, structured=True) and not spreads(None, 0)
    assert not spreads(None, 2, structured=True)  # drafts: one-hot rows
    monkeypatch.setenv(SAMPLER_ENV, "stand-in")
    assert not spreads(None, 0, structured=True)


# ------------------------------------------------------------------ the grammar rule
ALLOWED = {"a": (1, 3, 5), "b": (2, 9)}


def _listed(values: list) -> FieldObs:
    return FieldObs("list", "", (len(values),), values)


def _judged(rows: dict[str, tuple[int, ...]], tokens: dict[str, int]) -> list:
    """One step: a and b (structured, 4-token prompts, no parameters) in batch rows 0 and 1,
    listed b first; ``rows`` names the allowed set each row was masked with."""
    step = Step(new_requests=[NewRequest("a", 4, structured_output=True), NewRequest("b", 4, structured_output=True)],
                num_scheduled_tokens={"a": 4, "b": 4}, grammar={"b": ALLOWED["b"], "a": ALLOWED["a"]})
    processed = np.full((2, VOCAB), -np.inf, dtype=np.float32)
    for row, req_id in enumerate("ab"):
        mask = list(rows[req_id])
        processed[row, mask] = spread_logits(req_id, 3, VOCAB)[mask]
    sampled = np.array([tokens["a"], tokens["b"]])
    obs = StepObs(0, stages=[StageObs(POSTPROCESS, fields={"output.req_ids": _listed(["a", "b"]),
                                                           "output.sampled_token_ids": _listed([[t] for t in sampled])})])
    obs.sampled = {"rows": [(0, "a", 3), (1, "b", 3)], "calls": [SampledRows(processed, sampled, np.array([0, 1]))],
                   "history": {}, "logprobs": None}
    return SamplingOracle(RunnerConfig(), vocab_size=VOCAB).check(0, step, obs)


def test_each_row_masked_by_its_own_grammar_is_clean(monkeypatch):
    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    assert _judged(ALLOWED, {"a": 3, "b": 9}) == []


def test_a_mask_landed_on_the_other_request_is_found_on_both_rows(monkeypatch):
    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    # mapped by the scheduler's list (b first) instead of the batch rows: a gets b's mask, b gets a's
    found = _judged({"a": ALLOWED["b"], "b": ALLOWED["a"]}, {"a": 9, "b": 5})
    assert [(f.field, f.req_ids) for f in found] == [
        ("sampler.grammar_mask", ("a",)), ("sampler.grammar_token", ("a",)),
        ("sampler.grammar_mask", ("b",)), ("sampler.grammar_token", ("b",))]
    assert found[0].expected == "-inf outside the 3 tokens its grammar allows"
    assert found[0].actual.startswith("2 finite outside them (token 2: ")
    assert found[1].actual == "9 (sampled)"


def test_a_token_outside_the_set_is_found_even_when_the_row_is_right(monkeypatch):
    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    found = _judged(ALLOWED, {"a": 3, "b": 4})
    assert [(f.field, f.req_ids, f.actual) for f in found] == [("sampler.grammar_token", ("b",), "4 (sampled)")]


# ------------------------------------------------------------------ the bundled trace
@pytest.mark.vllm
@pytest.mark.slow  # vLLM loaded in this process, 8 steps (~15 s)
def test_every_grammar_request_samples_inside_its_set_on_the_real_sampler(monkeypatch):
    from simrig.observe import handed_to_scheduler
    from simrig.vllm_runtime import platform  # lazy: vLLM loads only for the tests that need it

    monkeypatch.delenv(SAMPLER_ENV, raising=False)
    platform.configure()
    from simrig.harness import Harness  # lazy: after platform.configure()

    header, steps = read_trace(SAMPLE)
    harness = Harness(header.config)
    handed: dict[str, list[int]] = {}
    for step in steps:
        result = harness.run_step(step)
        assert not result.errors
        got = handed_to_scheduler(result)
        for req_id, allowed in step.grammar.items():
            assert len(got[req_id]) == 1 and got[req_id][0] in allowed, (req_id, got[req_id])
            handed.setdefault(req_id, []).extend(got[req_id])
    # a single allowed token is the one sampled (g1 at step 1, g3 at step 4)
    assert handed["g1"][1] == 77 and handed["g3"][3] == 4095
    assert set(handed) == {"g1", "g2", "g3", "g4"}


# ------------------------------------------------------------------ the strategies
def test_an_allowed_set_keeps_a_token_the_requests_own_masks_leave_open():
    from strategies.grammar import allowed_tokens

    spec = SamplingSpec(bad_words=((5,), (1, 6)), stop_token_ids=(7,), min_tokens=1)
    for position in range(50):
        one = allowed_tokens("r0", position, 1, spec, 8)
        assert len(one) == 1 and one[0] not in (5, 6, 7)
    assert allowed_tokens("r0", 3, 8, None, 8) == tuple(range(8))
    assert allowed_tokens("r0", 3, 4, None) == allowed_tokens("r0", 3, 4, None)  # fixed: shrinking keeps it


def _drawn_grammar_is_valid(config, steps, tmp_path: Path) -> None:
    structured = set()
    for step in steps:
        structured |= {r.req_id for r in step.new_requests if r.structured_output}
        # listed in the scheduler's order, only requests scheduled (and structured) this step
        assert list(step.grammar) == [r for r in step.num_scheduled_tokens if r in step.grammar]
        assert set(step.grammar) <= structured
        assert all(ids and list(ids) == sorted(set(ids)) for ids in step.grammar.values())
    path = tmp_path / "drawn.jsonl"
    write_trace(path, TraceHeader(config=config), steps)
    assert read_trace(path)[1] == steps  # the reader's bounds take every drawn grammar


def _runs():
    from hypothesis import strategies as st

    from strategies.configs import runner_configs
    from strategies.steps import scheduled_runs

    return scheduled_runs(config=runner_configs(max_num_reqs=st.just(4), max_model_len=st.just(64),
                                                num_speculative_tokens=st.just(0)), min_steps=4, max_steps=8)


def test_drawn_grammars_are_valid(tmp_path):
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(_runs())
    def valid(run):
        _drawn_grammar_is_valid(*run, tmp_path)

    valid()


# Hypothesis searches up to a few hundred runs for each (about 2 s: no shrinking)
def test_drawn_grammars_come_out_of_batch_order_with_single_and_large_sets():
    from hypothesis import HealthCheck, Phase, find, settings

    def out_of_batch_order(run) -> bool:
        # a request with several tokens listed before a one-token one: the runner's batch puts
        # one-token rows first, so its bitmask rows come in another order than its logit rows
        for step in run[1]:
            counts = [step.num_scheduled_tokens[r] for r in step.grammar]
            if any(a > 1 and b == 1 for i, a in enumerate(counts) for b in counts[i + 1:]):
                return True
        return False

    def sized(low: int, high: int):
        return lambda run: any(low <= len(ids) <= high for step in run[1] for ids in step.grammar.values())

    # the first run that has it: the question is whether the strategies draw it, not its smallest form
    quick = settings(max_examples=2000, database=None, suppress_health_check=list(HealthCheck),
                     phases=[Phase.generate])
    for predicate in (out_of_batch_order, sized(1, 1), sized(2048, 4095)):
        assert predicate(find(_runs(), predicate, settings=quick))


@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["stand-in", "parameters"])
def test_a_grammar_request_asking_logprobs_replays_clean_under_either_sampler(monkeypatch, mode):
    """The trace the shrinker wrote when the logprobs check masked a grammar the runner was never
    handed (SIMRIG_SAMPLER=stand-in: one-hot rows, no bitmask): `r0` asks every logprob and
    allows one token its one-hot row does not hold."""
    from simrig.replay import replay_trace  # lazy: imports vLLM

    monkeypatch.setenv(SAMPLER_ENV, mode)
    result = replay_trace(RIG / "tests" / "fixtures" / "standin_grammar_logprobs.jsonl")
    assert set(result.findings["verdict"]) <= {"known"}
    assert result.findings[result.findings["check"] == "sampling"].empty
