"""Trace format v1: round trips, validation, the malformed corpus (no vLLM needed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step
from simrig.trace_io.trace import TraceError, TraceHeader, TraceReader, TraceWriter, read_trace, write_trace

HERE = Path(__file__).resolve().parent
MALFORMED = HERE / "malformed"
SAMPLES = HERE.parent / "traces" / "samples"

# file -> (line, field, start of the problem): the one-line error each must give.
MALFORMED_EXPECTED = {
    "truncated_line.jsonl": (4, "step", "invalid JSON"),
    "wrong_type.jsonl": (2, "new_requests[0].prompt_len", "must be an integer, got str '8'"),
    "idle_dummy_not_bool.jsonl": (3, "idle_dummy", "must be true or false, got 'no'"),
    "unknown_version.jsonl": (1, "version", "unsupported trace version 7"),
    "negative_tokens.jsonl": (3, "num_scheduled_tokens.r1", "must be >= 1, got -3"),
    "duplicate_new_id.jsonl": (3, "new_requests[0].id", "duplicate new request id 'r1'"),
    "unknown_cached_id.jsonl": (4, "cached_requests[1].id", "unknown cached request id 'r7'"),
    "bad_header.jsonl": (1, "config.max_batch", "unknown field"),
    "empty.jsonl": (1, "header", "empty file"),
    "unknown_field.jsonl": (4, "num_sched_tokens", "unknown field"),
    "step_gap.jsonl": (3, "step", "expected step 1, got 5"),
    "truncated_gzip.jsonl.gz": (None, "file", "truncated"),
}


def rich_steps() -> list[Step]:
    """Every field of the format at a non-default value somewhere."""
    return [
        Step(new_requests=[NewRequest("a", 5, max_tokens=9, block_ids=[0, 1]),
                           NewRequest("b", 3, prompt_token_ids=[7, 8, 9]),
                           NewRequest("c", 4, num_computed_tokens=2, prefill_len=6)],
             num_scheduled_tokens={"a": 5, "b": 3, "c": 4}),
        Step(cached=[CachedUpdate("a", 5, new_block_ids=[2]), CachedUpdate("b", 3),
                     CachedUpdate("c", 6, resumed=True)],
             num_scheduled_tokens={"a": 3, "b": 1, "c": 2}, spec_tokens={"a": 2, "c": 1},
             rejected={"a": 1}),
        Step(finished=["b"], preempted=["c"], cached=[CachedUpdate("a", 7)],
             num_scheduled_tokens={"a": 1}, idle_dummy=False),
        Step(),
    ]


CONFIG = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=32, max_model_len=64,
                      num_speculative_tokens=2, pcp_size=2, shard_decode_requests=True)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"t{suffix}"
    header = TraceHeader(config=CONFIG, source={"kind": "hand-written", "seed": 3})
    steps = rich_steps()
    assert write_trace(path, header, steps) == len(steps)
    got_header, got_steps = read_trace(path)
    assert got_header == header
    assert got_steps == steps
    # The compression really is the one the name asks for.
    raw = path.read_bytes()
    if suffix == ".jsonl.gz":
        assert raw[:2] == b"\x1f\x8b"
    elif suffix == ".jsonl.zst":
        assert raw[:4] == b"\x28\xb5\x2f\xfd"
    else:
        assert json.loads(raw.splitlines()[0])["format"] == "simrig-trace"


def test_reader_yields_line_numbers_and_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, TraceHeader(config=CONFIG), rich_steps()[:2])
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "", lines[1], "   ", lines[2]]) + "\n")
    assert [line for line, _ in TraceReader(path)] == [3, 5]


def test_writer_leaves_nothing_when_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    with pytest.raises(RuntimeError):
        with TraceWriter(path, TraceHeader()) as writer:
            writer.write(rich_steps()[0])
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_adversarial_header_lets_identity_violations_through(tmp_path: Path) -> None:
    steps = [Step(new_requests=[NewRequest("a", 2)], num_scheduled_tokens={"a": 2}),
             Step(new_requests=[NewRequest("a", 2)], cached=[CachedUpdate("ghost", 1)],
                  num_scheduled_tokens={"a": 2, "ghost": 1})]
    path = tmp_path / "adv.jsonl"
    write_trace(path, TraceHeader(adversarial=True), steps)
    assert read_trace(path)[1] == steps
    write_trace(path, TraceHeader(adversarial=False), steps)
    with pytest.raises(TraceError, match=r":3: new_requests\[0\]\.id: duplicate new request id 'a'"):
        read_trace(path)


def test_resumed_request_carries_outputs_as_prefill(tmp_path: Path) -> None:
    header, steps = read_trace(SAMPLES / "preempt_resume.jsonl")
    resumed = [r for s in steps for r in s.new_requests if r.prefill_len is not None]
    assert resumed and all(r.num_prefill_tokens > r.prompt_len for r in resumed)
    assert len(resumed[0].prefill_token_ids()) == resumed[0].prefill_len


@pytest.mark.parametrize("name", sorted(MALFORMED_EXPECTED))
def test_malformed_corpus_gives_one_line_error(name: str) -> None:
    path = MALFORMED / name
    line, field, problem = MALFORMED_EXPECTED[name]
    with pytest.raises(TraceError) as info:
        for _ in TraceReader(path):
            pass
    err = info.value
    assert (err.path, err.field) == (str(path), field)
    if line is not None:
        assert err.line == line
    assert err.problem.startswith(problem)
    assert str(err) == f"{path}:{err.line}: {field}: {err.problem}"
    assert "\n" not in str(err)


def test_corpus_is_complete() -> None:
    """Every file in tests/malformed has an expected error (and vice versa)."""
    assert {p.name for p in MALFORMED.iterdir() if p.suffix in (".jsonl", ".gz", ".zst")} == set(
        MALFORMED_EXPECTED)


def test_samples_are_valid_and_cover_the_scenarios() -> None:
    traces = {p.name: read_trace(p) for p in sorted(SAMPLES.glob("*.jsonl"))}
    assert len(traces) >= 5
    configs = [h.config for h, _ in traces.values()]
    all_steps = [s for _, steps in traces.values() for s in steps]
    assert {c.pcp_size for c in configs} >= {1, 2, 4}
    assert any(c.pcp_size > 1 and c.shard_decode_requests for c in configs)
    assert any(s.rejected for s in all_steps)  # spec decode with rejections
    assert any(s.preempted for s in all_steps)
    # chunked prefill: a new request scheduled for fewer tokens than it holds
    assert any(s.num_scheduled_tokens.get(r.req_id, 0) < r.num_prefill_tokens - r.num_computed_tokens
               for s in all_steps for r in s.new_requests)
    assert all(h.source["kind"] == "hand-written" and not h.adversarial for h, _ in traces.values())


def test_gzip_of_a_plain_trace_reads_the_same(tmp_path: Path) -> None:
    src = SAMPLES / "spec_decode.jsonl"
    dst = tmp_path / "spec_decode.jsonl.gz"
    dst.write_bytes(gzip.compress(src.read_bytes()))
    assert read_trace(dst) == read_trace(src)
