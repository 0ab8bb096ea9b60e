"""`simrig record`: the real vLLM scheduler, the synthetic sampler, the corpus.

One synthetic trace is recorded once per module (small KV cache, drafts,
shared prefixes) and replayed through the real runner harness.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.cli import main
from simrig.errors import UsageError
from simrig.replay import replay_problems as replay_errors
from simrig.sources.record import continuity_problems, stats_of
from simrig.sources.sampler import SyntheticSampler
from simrig.sources.workloads import clamp, parse_spec
from simrig.step import CachedUpdate, NewRequest, Step, synth_token
from simrig.trace_io.trace import TraceReader, read_trace

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "traces" / "recorded"
SPEC = "synthetic:requests=24,rate=50,prompt=16-160,output=4-40,shared_prefix=0.3,prefix_len=48"
RECORD_ARGS = ["--max-num-seqs", "8", "--max-num-batched-tokens", "128", "--max-model-len", "512",
               "--num-kv-blocks", "40", "--num-speculative-tokens", "2", "--acceptance-rate", "0.6",
               "--eos-prob", "0.02", "--seed", "1"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "mixed.jsonl.gz"
    assert main(["record", "--workload", SPEC, "--steps", "200", "--out", str(out), *RECORD_ARGS]) == 0
    return read_trace(out)


# ------------------------------------------------------- the recorded trace
def test_recorded_trace_covers_preemption_resume_chunking_drafts(recorded):
    header, steps = recorded
    stats = stats_of(steps)
    assert stats.preemptions >= 1
    assert stats.resumptions >= 1
    assert stats.chunked_prefill_steps >= 1
    assert stats.spec_decode_steps >= 1
    assert stats.rejected_tokens >= 1
    assert stats.prefix_cache_hits >= 1  # shared_prefix=0.3
    assert stats.finished == stats.requests == 24  # the workload drained


def test_recorded_header_matches_the_scheduler_config(recorded):
    header, _ = recorded
    assert header.source["kind"] == "recorded"
    assert header.source["tool"] == "simrig record"
    assert header.source["workload"] == SPEC and header.source["seed"] == 1
    assert header.source["vllm_version"]
    cfg = header.config
    assert (cfg.max_num_reqs, cfg.max_num_batched_tokens, cfg.max_model_len,
            cfg.num_speculative_tokens) == (8, 128, 512, 2)


def test_recorded_steps_respect_the_scheduler_limits(recorded):
    header, steps = recorded
    for step in steps:
        assert len(step.num_scheduled_tokens) <= header.config.max_num_reqs
        assert step.total_num_scheduled_tokens <= header.config.max_num_batched_tokens
        for r in step.new_requests:
            assert r.num_computed_tokens + step.num_scheduled_tokens[r.req_id] <= header.config.max_model_len


def test_computed_tokens_advance_by_scheduled_minus_rejected(recorded):
    _, steps = recorded
    assert continuity_problems(steps) == []


def test_shared_prefix_requests_carry_explicit_ids_and_resumes_derive_theirs(recorded):
    _, steps = recorded
    explicit = [r for s in steps for r in s.new_requests if r.prompt_token_ids is not None]
    assert explicit, "shared-prefix prompts must be written as token ids"
    plain = [r for s in steps for r in s.new_requests if r.prompt_token_ids is None]
    assert plain
    resumed = [r for s in steps for r in s.new_requests if r.prefill_len]
    assert all(r.prefill_len > r.prompt_len for r in resumed)


def test_recorded_trace_replays_clean_through_the_real_runner(recorded, vllm_api):
    header, steps = recorded
    assert replay_errors(header, steps, vllm_api) == []


def test_continuity_check_catches_a_broken_trace():
    steps = [Step(new_requests=[NewRequest("a", 8)], num_scheduled_tokens={"a": 8}),
             Step(cached=[CachedUpdate("a", 9)], num_scheduled_tokens={"a": 1})]
    assert continuity_problems(steps) == ["step 1: a: num_computed_tokens 9, expected 8"]


def test_stats_count_chunks_and_resumptions():
    steps = [Step(new_requests=[NewRequest("a", 40)], num_scheduled_tokens={"a": 16}),
             Step(preempted=["a"]),
             Step(new_requests=[NewRequest("a", 40, prefill_len=41)], num_scheduled_tokens={"a": 41})]
    stats = stats_of(steps)
    assert (stats.chunked_prefill_steps, stats.preemptions, stats.resumptions) == (1, 1, 1)
    assert stats.prefix_cache_hits == 0


# ---------------------------------------------------------------- sampler
def test_sampler_skips_prefill_chunks_and_counts_rejections():
    sampler = SyntheticSampler(seed=3, acceptance_rate=0.0, num_speculative_tokens=2)
    step = Step(num_scheduled_tokens={"p": 16, "d": 3}, spec_tokens={"d": 2})
    state = {"p": (16, 40), "d": (12, 10)}  # p mid-prompt; d: 10 tokens + 2 drafts computed
    out = sampler.sample(step, state.get)
    assert "p" not in out.sampled
    assert out.sampled["d"] == [synth_token("d", 10)]  # no draft accepted: one bonus token
    assert out.rejected == {"d": 2}
    assert sampler.drafts(["d"], {"d": (11, 12)}.get) == {"d": [synth_token("d", 12), synth_token("d", 13)]}


def test_sampler_accepts_all_drafts_at_rate_one_and_stops_on_eos():
    step = Step(num_scheduled_tokens={"d": 3}, spec_tokens={"d": 2})
    out = SyntheticSampler(acceptance_rate=1.0).sample(step, lambda r: (12, 10))
    assert out.sampled["d"] == [synth_token("d", 10 + j) for j in range(3)] and out.rejected == {"d": 0}
    out = SyntheticSampler(eos_prob=1.0, stop_token_id=-7).sample(step, lambda r: (12, 10))
    assert out.sampled["d"] == [-7]


# ------------------------------------------------------------ SPEC grammar
def test_synthetic_spec_is_deterministic_and_in_range():
    a = parse_spec("synthetic:requests=50,rate=4,prompt=10-20,output=3,shared_prefix=1,prefix_len=8")
    b = parse_spec("synthetic:requests=50,rate=4,prompt=10-20,output=3,shared_prefix=1,prefix_len=8")
    assert [(r.req_id, r.arrival_s, r.prompt_len) for r in a] == [(r.req_id, r.arrival_s, r.prompt_len) for r in b]
    assert all(10 <= r.prompt_len <= 20 and r.max_tokens == 3 for r in a)
    assert a[-1].arrival_s > 0 and all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    heads = {tuple(r.prompt_token_ids[:8]) for r in a}
    assert 1 < len(heads) <= 4  # four shared prefixes by default


@pytest.mark.parametrize("spec, needle", [
    ("nonsense", "expected KIND:"),
    ("poisson:requests=3", "unknown kind 'poisson'"),
    ("synthetic:requests=0", "requests: must be >= 1"),
    ("synthetic:prompt=9-3", "prompt: need 1 <= LO <= HI"),
    ("synthetic:colour=red", "unknown synthetic key 'colour'"),
    ("synthetic:shared_prefix=2", "shared_prefix: must be in [0, 1]"),
    ("azure:", "needs a file path"),
])
def test_bad_spec_is_one_usage_error(spec, needle):
    with pytest.raises(UsageError, match=None) as info:
        parse_spec(spec)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_bad_spec_on_the_command_line_exits_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "t.jsonl.gz"
    assert main(["record", "--workload", "synthetic:rate=fast", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rate: expected a float" in err[0]
    assert not out.exists()
    assert main(["record", "--workload", "synthetic:", "--out", str(tmp_path / "t.txt")]) == 2


def test_clamp_keeps_one_output_token_and_cuts_the_prompt_first():
    reqs = parse_spec("synthetic:requests=1,prompt=900,output=300")
    assert clamp(reqs, 1000) == 1
    assert (reqs[0].prompt_len, reqs[0].max_tokens) == (900, 100)
    reqs = parse_spec("synthetic:requests=1,prompt=2000,output=5")
    clamp(reqs, 1000)
    assert (reqs[0].prompt_len, reqs[0].max_tokens) == (999, 1)


# ----------------------------------------------------------------- corpus
def corpus_files() -> list[Path]:
    return sorted(CORPUS.glob("*.jsonl.gz"))


def test_corpus_is_small_and_covers_every_scheduler_behaviour():
    files = corpus_files()
    assert files, "traces/recorded/ is empty: run scripts/make_corpus.sh"
    assert sum(f.stat().st_size for f in files) < 5 * 1024 * 1024
    totals, pcp = [], False
    for f in files:
        header, steps = read_trace(f)
        assert header.source["kind"] == "recorded" and header.source["vllm_version"]
        assert continuity_problems(steps) == [], f.name
        pcp |= header.config.pcp_size > 1
        totals.append(stats_of(steps))  # request ids repeat across files: count per file
    assert pcp
    for name in ("preemptions", "resumptions", "chunked_prefill_steps", "spec_decode_steps",
                 "prefix_cache_hits"):
        assert sum(getattr(t, name) for t in totals) >= 1, name


def test_corpus_pcp_trace_replays_clean_on_every_rank(vllm_api):
    files = [f for f in corpus_files() if TraceReader(f).header.config.pcp_size > 1]
    assert files
    header, steps = read_trace(files[0])
    assert replay_errors(header, steps[:60], vllm_api) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", [f.name for f in corpus_files()])
def test_every_corpus_trace_replays_clean(name, vllm_api):
    header, steps = read_trace(CORPUS / name)
    assert replay_errors(header, steps, vllm_api) == []
