"""`simrig import`: Azure / BurstGPT / Mooncake workloads through the real scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrig.cli import main
from simrig.errors import UsageError
from simrig.replay import replay_problems as replay_errors
from simrig.sources.record import continuity_problems, stats_of
from simrig.sources.workloads import MOONCAKE_BLOCK, azure, burstgpt, mooncake, prefix_token, read_file
from simrig.step import synth_token
from simrig.trace_io.trace import read_trace

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def shared_data() -> Path:
    """../shared/data next to the repository (``SIMRIG_SHARED_DATA`` overrides)."""
    import os

    env = os.environ.get("SIMRIG_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


AZURE = shared_data() / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = shared_data() / "mooncake-fast25" / "conversation_trace.jsonl"
needs_azure = pytest.mark.skipif(not AZURE.exists(), reason=f"Azure trace not present at {AZURE}")
needs_mooncake = pytest.mark.skipif(not MOONCAKE.exists(), reason=f"Mooncake trace not present at {MOONCAKE}")
# Small enough to replay in seconds; arrivals compressed so batches form.
IMPORT_ARGS = ["--limit", "100", "--steps", "80", "--time-scale", "0.05", "--max-model-len", "2048",
               "--max-num-seqs", "16", "--max-num-batched-tokens", "512", "--num-kv-blocks", "512"]


# ---------------------------------------------------------------- readers
def test_burstgpt_fixture_skips_failed_rows_and_keeps_order():
    reqs = burstgpt(FIXTURES / "burstgpt_small.csv")
    assert [(r.arrival_s, r.prompt_len, r.max_tokens) for r in reqs] == [
        (0.0, 472, 18), (40.0, 1087, 226), (113.0, 417, 1), (207.0, 1360, 1),
        (207.5, 60, 300), (208.0, 3000, 120)]
    assert reqs[0].prompt_token_ids is None
    assert reqs[0].token_ids() == [synth_token(reqs[0].req_id, p) for p in range(472)]
    assert len(burstgpt(FIXTURES / "burstgpt_small.csv", limit=2)) == 2


def test_mooncake_hash_ids_become_shared_token_blocks(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [7, 8]}\n'
                    '{"timestamp": 1500, "input_length": 600, "output_length": 0, "hash_ids": [7, 9]}\n')
    a, b = mooncake(path)
    assert (b.arrival_s, b.max_tokens) == (1.5, 1)
    assert a.prompt_token_ids[:MOONCAKE_BLOCK] == b.prompt_token_ids[:MOONCAKE_BLOCK]
    assert a.prompt_token_ids[0] == prefix_token("m7", 0)
    assert a.prompt_token_ids[MOONCAKE_BLOCK:] != b.prompt_token_ids[MOONCAKE_BLOCK:600]
    assert len(a.prompt_token_ids) == 700 and len(b.prompt_token_ids) == 600


def test_azure_timestamps_are_relative_seconds(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.5000000,374,44\n2023-11-16 18:15:48.2500000,396,109\n")
    reqs = azure(path)
    assert [(round(r.arrival_s, 3), r.prompt_len, r.max_tokens) for r in reqs] == [
        (0.0, 374, 44), (1.75, 396, 109)]


@pytest.mark.parametrize("fmt, text, needle", [
    ("azure", "TIMESTAMP,Context\n1,2\n", ":1: header: missing column(s) ContextTokens, GeneratedTokens"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n1,many,3\n", ":2: ContextTokens: expected an integer"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\nsoon,x,1,2\n", ":2: Timestamp: not a timestamp"),
    ("mooncake", '{"timestamp": 0, "input_length": 5}\n', ":1: output_length: missing"),
    ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n',
     ":1: hash_ids: must be a list"),
    ("mooncake", "{oops\n", ":1: line: invalid JSON"),
])
def test_malformed_workload_is_one_line_naming_file_line_field(tmp_path, fmt, text, needle):
    path = tmp_path / "w.txt"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        read_file(fmt, path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_import_command_rejects_bad_input_with_exit_2(tmp_path, capsys):
    out = tmp_path / "t.jsonl.gz"
    assert main(["import", "--format", "azure", str(tmp_path / "missing.csv"), "--out", str(out)]) == 2
    assert main(["import", "--format", "burstgpt", str(FIXTURES / "burstgpt_small.csv"),
                 "--out", str(out), "--limit", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "missing.csv:0: file:" in err[0] and "--limit: must be >= 1" in err[1]
    assert not out.exists()


# ----------------------------------------------- through the real scheduler
def _import(tmp_path, fmt: str, path: Path, *extra: str):
    out = tmp_path / f"{fmt}.jsonl.gz"
    assert main(["import", "--format", fmt, str(path), "--out", str(out), *extra]) == 0
    return read_trace(out)


def test_burstgpt_import_replays_clean(tmp_path, vllm_api):
    header, steps = _import(tmp_path, "burstgpt", FIXTURES / "burstgpt_small.csv",
                            "--max-model-len", "2048", "--time-scale", "0.01", "--max-num-seqs", "16",
                            "--max-num-batched-tokens", "512", "--num-kv-blocks", "512")
    assert header.source["kind"] == "imported" and header.source["format"] == "burstgpt"
    stats = stats_of(steps)
    assert stats.requests == stats.finished == 6  # drained
    assert header.source["clamped"] == 1  # 3000 + 120 tokens > 2048
    assert continuity_problems(steps) == []
    assert replay_errors(header, steps[:60], vllm_api) == []


@needs_azure
def test_azure_import_first_100_replays_clean(tmp_path, vllm_api):
    header, steps = _import(tmp_path, "azure", AZURE, *IMPORT_ARGS)
    stats = stats_of(steps)
    assert stats.steps == 80 and stats.requests > 10 and stats.chunked_prefill_steps >= 1
    assert continuity_problems(steps) == []
    assert replay_errors(header, steps, vllm_api) == []


@needs_mooncake
def test_mooncake_import_first_100_hits_the_prefix_cache_and_replays_clean(tmp_path, vllm_api):
    header, steps = _import(tmp_path, "mooncake", MOONCAKE, *IMPORT_ARGS)
    stats = stats_of(steps)
    assert stats.prefix_cache_hits >= 1 and stats.prefix_cache_hit_tokens >= MOONCAKE_BLOCK
    hits = [r for s in steps for r in s.new_requests if r.num_computed_tokens]
    assert all(r.prompt_token_ids is not None for r in hits)  # the shared ids are in the trace
    assert continuity_problems(steps) == []
    assert replay_errors(header, steps, vllm_api) == []
