"""Input bounded before vLLM runs (issue 39, part 5): every size in a trace
against its own config, and the config against the machine, refused as one
line ``FILE:LINE: FIELD: problem`` with exit 2 before anything is allocated.

The CLI rows run ``simrig replay`` as a user does, in a process whose address
space is capped (``RLIMIT_AS``): a prompt of 10^12 tokens once grew the
process to 24 GB; here it must be refused within the cap. None of them
imports vLLM, so each costs about half a second.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from simrig.step import KvGroup, RunnerConfig
from simrig.trace_io import bounds
from simrig.trace_io.trace import TraceError, read_trace, trace_files_in
from strategies.configs import runner_configs

ROOT = Path(__file__).resolve().parents[1]
_BIN = Path(sys.executable).parent / "simrig"
SIMRIG = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "simrig"]
CAP = 6 << 30  # RLIMIT_AS of every CLI run here
SMALL = {"max_num_reqs": 8, "max_num_batched_tokens": 64, "max_model_len": 256}  # 129 KV blocks


def _trace(path: Path, config: dict, steps: list[dict], **header) -> Path:
    head = {"format": "simrig-trace", "version": 1, "config": config, "source": {"kind": "hand-written"},
            **header}
    path.write_text("".join(json.dumps(x) + "\n" for x in [head, *steps]))
    return path


def _new(rid: str, n: int, **extra) -> dict:
    return {"id": rid, "prompt_len": n, **extra}


def _cap(limit: int = CAP):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def _replay(path: Path, out: Path, *, env: dict | None = None,
            limit: int = CAP) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    full_env.pop(bounds.MEMORY_ENV, None)
    full_env.update(env or {})
    return subprocess.run([*SIMRIG, "replay", "--no-coverage", str(path), "--out", str(out)], capture_output=True, text=True,
                          env=full_env, timeout=120, preexec_fn=_cap(limit), cwd=out.parent)


# (name, header config, steps, header extras, line, field, what the problem says)
CASES = [
    ("prompt_len_1e12", SMALL, [{"new_requests": [_new("a", 10**12)], "num_scheduled_tokens": {"a": 16}}], {},
     2, "new_requests[0].prompt_len", "1000000000000 exceeds config.max_model_len 256"),
    ("max_model_len_2_40", {**SMALL, "max_model_len": 2**40}, [], {},
     1, "config.max_model_len", "the runner would allocate about "),
    ("block_id_1e9", SMALL,
     [{"new_requests": [_new("a", 16, block_ids=[1, 10**9])], "num_scheduled_tokens": {"a": 16}}], {},
     2, "new_requests[0].block_ids[1]", "block id 1000000000 is past the KV cache's 129 blocks"),
    ("cached_block_id_past_the_cache", SMALL,
     [{"new_requests": [_new("a", 16, block_ids=[1])], "num_scheduled_tokens": {"a": 16}},
      {"cached_requests": [{"id": "a", "num_computed_tokens": 16, "new_block_ids": [129]}],
       "num_scheduled_tokens": {"a": 1}}], {},
     3, "cached_requests[0].new_block_ids[0]", "block id 129 is past the KV cache's 129 blocks"),
    ("prompt_len_1e12_adversarial", SMALL,
     [{"new_requests": [_new("a", 10**12)], "num_scheduled_tokens": {"a": 16}}], {"adversarial": True},
     2, "new_requests[0].prompt_len", "exceeds config.max_model_len 256"),
    ("prefill_len", SMALL,
     [{"new_requests": [_new("a", 8, prefill_len=257)], "num_scheduled_tokens": {"a": 8}}], {},
     2, "new_requests[0].prefill_len", "257 exceeds config.max_model_len 256"),
    ("batch_over_budget", SMALL,
     [{"new_requests": [_new("a", 40), _new("b", 40)], "num_scheduled_tokens": {"a": 40, "b": 25}}], {},
     2, "num_scheduled_tokens", "the batch schedules 65 tokens, config.max_num_batched_tokens is 64"),
    ("more_requests_than_slots", {**SMALL, "max_num_reqs": 2},
     [{"new_requests": [_new("a", 4), _new("b", 4), _new("c", 4)], "num_scheduled_tokens": {"a": 4}}], {},
     2, "new_requests", "the runner would hold 3 requests, config.max_num_reqs is 2"),
    ("position_past_max_model_len", SMALL,
     [{"new_requests": [_new("a", 250)], "num_scheduled_tokens": {"a": 60}},
      {"cached_requests": [{"id": "a", "num_computed_tokens": 60}], "num_scheduled_tokens": {"a": 60}},
      {"cached_requests": [{"id": "a", "num_computed_tokens": 120}], "num_scheduled_tokens": {"a": 60}},
      {"cached_requests": [{"id": "a", "num_computed_tokens": 180}], "num_scheduled_tokens": {"a": 60}},
      {"cached_requests": [{"id": "a", "num_computed_tokens": 240}], "num_scheduled_tokens": {"a": 17}}], {},
     6, "num_scheduled_tokens.a", "240 computed + 17 scheduled tokens exceed config.max_model_len 256"),
    ("token_id_past_int32", SMALL,
     [{"new_requests": [_new("a", 2, token_ids=[5, 2**31])], "num_scheduled_tokens": {"a": 2}}], {},
     2, "new_requests[0].token_ids[1]", "2147483648 does not fit the runner's int32 token table"),
    ("max_num_reqs_1e9", {**SMALL, "max_num_reqs": 10**9}, [], {},
     1, "config.max_num_reqs", "the runner would allocate about "),
    # issue 48: vLLM's dispatch map and a dummy run's warm-up adapters hold every LoRA slot
    ("max_loras_1e9", {"max_loras": 10**9},
     [{"new_requests": [_new("a", 8)], "num_scheduled_tokens": {"a": 8}}], {},
     1, "config.max_loras", "the runner would allocate about "),
    # 10,000 KV cache groups fit in memory; a few ms each, in every step, do not fit the time
    ("kv_groups_1e4", {**SMALL, "kv_groups": [{}] * 10_000}, [], {},
     1, "config.kv_groups", "to start and run one full step of this config on a CPU, past the 60 s"),
]


@pytest.mark.parametrize("name, config, steps, header, line, field, problem", CASES,
                         ids=[c[0] for c in CASES])
def test_out_of_bounds_input_is_one_line_exit_2_before_vllm(tmp_path, name, config, steps, header, line,
                                                           field, problem):
    path = _trace(tmp_path / f"{name}.jsonl", config, steps, **header)
    out = tmp_path / "out"
    proc = _replay(path, out)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith(f"simrig replay: error: {path}:{line}: {field}: "), lines[0]
    assert problem in lines[0]
    assert not out.exists()


def test_the_allocation_error_compares_the_estimate_with_the_memory_there_is(tmp_path):
    """max_model_len 2^40: what the config would allocate (petabytes) against what
    this process can have, named by the field that weighs most."""
    path = _trace(tmp_path / "t.jsonl", {**SMALL, "max_model_len": 2**40}, [])
    proc = _replay(path, tmp_path / "out")
    assert proc.returncode == 2
    message = proc.stderr.strip().split(": config.max_model_len: ", 1)[1]
    need, have = message.split("; ")
    assert need.startswith("the runner would allocate about ") and need.endswith(" PB for this config")
    assert have.startswith(("this machine has", "this process may map", "this container has"))


def test_the_memory_limit_variable_replaces_what_the_machine_has(tmp_path, monkeypatch):
    """A modest config refused under a small SIMRIG_MEMORY_LIMIT_BYTES, read at a large one."""
    config = {"max_num_reqs": 64, "max_num_batched_tokens": 256, "max_model_len": 8192}
    step = {"new_requests": [_new("a", 8)], "num_scheduled_tokens": {"a": 8}}
    path = _trace(tmp_path / "t.jsonl", config, [step])
    proc = _replay(path, tmp_path / "out", env={bounds.MEMORY_ENV: "10M"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"simrig replay: error: {path}:1: config.max_model_len: the runner would allocate about "
        f"{bounds.format_bytes(bounds.estimate_bytes(RunnerConfig(**config)))} for this config; "
        f"{bounds.MEMORY_ENV} allows 10.5 MB")
    monkeypatch.setenv(bounds.MEMORY_ENV, "64G")
    header, steps = read_trace(path)
    assert header.config.max_model_len == 8192 and len(steps) == 1
    proc = _replay(path, tmp_path / "out", env={bounds.MEMORY_ENV: "lots"})
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert f"{path}:1: config: {bounds.MEMORY_ENV} must be a number of bytes" in proc.stderr


def _rle_zstd(nbytes: int) -> bytes:
    """A zstd frame of ``nbytes`` spaces in RLE blocks: 4 bytes for every 128 KiB."""
    block = 128 << 10
    count = nbytes // block
    head = (0xFD2FB528).to_bytes(4, "little") + bytes([0x00, 7 << 3])  # no content size, 128 KiB window
    return head + b"".join(((block << 3) | (1 << 1) | (i == count - 1)).to_bytes(3, "little") + b" "
                           for i in range(count))


def test_a_decompression_bomb_is_one_line_in_bounded_memory(tmp_path):
    """8 GiB of spaces in 256 KiB of zstd, read by a process capped at 1.5 GiB:
    the reader decompresses a little at a time and stops at the longest line a
    header may have (it used to inflate 64 KiB of input, 2 GiB, in one call)."""
    path = tmp_path / "bomb.jsonl.zst"
    path.write_bytes(_rle_zstd(8 << 30))
    proc = _replay(path, tmp_path / "out", limit=3 << 29)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"simrig replay: error: {path}:1: file: line longer than {bounds.HEADER_LINE_BYTES} bytes "
        f"(the most a trace of this config needs)"]


# ------------------------------------------------------------ in process: the edges
def _read(tmp_path: Path, config: dict, steps: list[dict], **header):
    return read_trace(_trace(tmp_path / "t.jsonl", config, steps, **header))


def _refused(tmp_path: Path, config: dict, steps: list[dict], **header) -> str:
    with pytest.raises(TraceError) as err:
        _read(tmp_path, config, steps, **header)
    return str(err.value).split(": ", 1)[1]


def test_each_bound_holds_at_its_edge_and_fails_one_past_it(tmp_path):
    cfg = {"max_num_reqs": 2, "max_num_batched_tokens": 64, "max_model_len": 64, "block_size": 16}
    # 2 slots x 4 blocks per request + the null block: ids 0..8
    assert RunnerConfig(**cfg).num_kv_blocks == 9
    at = [{"new_requests": [_new("a", 64, block_ids=[8, 7, 6, 5])], "num_scheduled_tokens": {"a": 64}}]
    assert len(_read(tmp_path, cfg, at)[1]) == 1
    assert _refused(tmp_path, cfg, [{"new_requests": [_new("a", 65)]}]).startswith(
        "new_requests[0].prompt_len: 65 exceeds")
    assert _refused(tmp_path, cfg, [{"new_requests": [_new("a", 4, block_ids=[9])]}]).startswith(
        "new_requests[0].block_ids[0]: block id 9 is past the KV cache's 9 blocks")
    # a row holds max_model_len / block_size blocks, appended across steps
    grow = [{"new_requests": [_new("a", 4, block_ids=[1, 2, 3])], "num_scheduled_tokens": {"a": 4}},
            {"cached_requests": [{"id": "a", "num_computed_tokens": 4, "new_block_ids": [4]}]}]
    assert len(_read(tmp_path, cfg, grow)[1]) == 2
    grow[1]["cached_requests"][0]["new_block_ids"] = [4, 5]
    assert _refused(tmp_path, cfg, grow) == (
        "cached_requests[0].new_block_ids: request 'a' would hold 5 blocks; "
        "its block-table row holds 4 (config.max_model_len 64 / block size 16)")
    # the batch: tokens and requests
    two = [_new("a", 32), _new("b", 33)]
    assert _refused(tmp_path, cfg, [{"new_requests": two, "num_scheduled_tokens": {"a": 32, "b": 33}}]) == (
        "num_scheduled_tokens: the batch schedules 65 tokens, config.max_num_batched_tokens is 64")
    fits = [{"new_requests": two, "num_scheduled_tokens": {"a": 32, "b": 32}}]
    assert len(_read(tmp_path, cfg, fits)[1]) == 1
    # held requests: a finished one frees its slot in the same step
    churn = [{"new_requests": [_new("a", 4), _new("b", 4)]},
             {"finished": ["a"], "new_requests": [_new("c", 4)]}]
    assert len(_read(tmp_path, cfg, churn)[1]) == 2
    churn[1]["finished"] = []
    assert _refused(tmp_path, cfg, churn) == (
        "new_requests: the runner would hold 3 requests, config.max_num_reqs is 2")


def test_positions_follow_the_progress_rule_for_a_request_scheduled_without_an_update(tmp_path):
    """computed + scheduled <= max_model_len also where the step states no computed
    count: the earlier steps' (computed + scheduled - rejected) stands in."""
    cfg = {"max_num_reqs": 2, "max_num_batched_tokens": 64, "max_model_len": 64, "num_speculative_tokens": 2}
    steps = [{"new_requests": [_new("a", 60)], "num_scheduled_tokens": {"a": 60}},
             {"num_scheduled_tokens": {"a": 3}, "spec_tokens": {"a": 2}, "rejected": {"a": 2}},
             {"num_scheduled_tokens": {"a": 3}, "spec_tokens": {"a": 2}}]
    assert len(_read(tmp_path, cfg, steps, adversarial=True)[1]) == 3  # 60, 61, 61 + 3 = 64
    steps.append({"num_scheduled_tokens": {"a": 1}})
    assert _refused(tmp_path, cfg, steps, adversarial=True) == (
        "num_scheduled_tokens.a: 64 computed + 1 scheduled tokens exceed config.max_model_len 64")


def test_adversarial_traces_keep_their_identity_violations_but_not_oversized_input(tmp_path):
    ghost = [{"cached_requests": [{"id": "ghost", "num_computed_tokens": 0}],
              "num_scheduled_tokens": {"ghost": 1}}]
    assert _refused(tmp_path, SMALL, ghost).startswith("cached_requests[0].id: unknown cached request id")
    assert len(_read(tmp_path, SMALL, ghost, adversarial=True)[1]) == 1
    ghost[0]["cached_requests"][0]["new_block_ids"] = [10**9]
    assert "block id 1000000000 is past" in _refused(tmp_path, SMALL, ghost, adversarial=True)
    ghost[0]["cached_requests"][0] = {"id": "ghost", "num_computed_tokens": 10**12}
    assert _refused(tmp_path, SMALL, ghost, adversarial=True) == (
        "cached_requests[0].num_computed_tokens: 1000000000000 exceeds config.max_model_len 256")


def test_int32_fields_and_lines_past_the_longest_a_config_needs(tmp_path):
    huge_tokens = [{"new_requests": [_new("a", 4, max_tokens=2**31 - 4)]}]
    assert "new_requests[0].max_tokens: prompt_len + max_tokens must fit" in \
        _refused(tmp_path, SMALL, huge_tokens)
    assert _refused(tmp_path, {**SMALL, "max_loras": 1}, [{"new_requests": [_new("a", 4, lora_id=2**31)]}]) \
        .startswith("new_requests[0].lora_id: 2147483648 does not fit")
    assert _refused(tmp_path, {**SMALL, "block_size": 2**31}, []).startswith(
        "config.block_size: 2147483648 does not")
    tiny = {"max_num_reqs": 1, "max_num_batched_tokens": 1, "max_model_len": 1}
    limit = bounds.max_line_bytes(RunnerConfig(**tiny))
    path = _trace(tmp_path / "long.jsonl", tiny, [])
    with path.open("a") as f:
        f.write('{"finished": ["' + "x" * limit + '"]}\n')
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == (f"{path}:2: file: line longer than {limit} bytes "
                              f"(the most a trace of this config needs)")


def test_the_kv_block_count_is_one_formula_for_the_reader_and_the_adapter():
    """``RunnerConfig.num_kv_blocks`` sizes the KV cache the adapter builds (vLLM's
    KVCacheConfig) and bounds the block ids the reader accepts."""
    pytest.importorskip("vllm")
    from simrig.adapters import wiring

    for config in (RunnerConfig(), RunnerConfig(max_num_reqs=3, max_model_len=100),
                   RunnerConfig(max_model_len=100, kv_groups=(KvGroup(), KvGroup("sliding_window", 8, 4)))):
        assert wiring.kv_cache_config(config).num_blocks == config.num_kv_blocks
        assert [wiring.blocks_per_request(config, g) for g in range(config.num_kv_groups)] == \
            [config.blocks_per_request(g) for g in range(config.num_kv_groups)]
    two_groups = (KvGroup(), KvGroup("sliding_window", 8, 4))
    # ceil(100 / 16) = 7 blocks in the full group, ceil(100 / 4) = 25 in the sliding-window one
    assert RunnerConfig(max_num_reqs=3, max_model_len=100, kv_groups=two_groups).num_kv_blocks == 3 * 32 + 1


# ------------------------------------------------------------ the estimate itself
def test_the_estimate_grows_with_each_size_and_names_the_heaviest_field():
    base = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=256)
    small = bounds.estimate_bytes(base)
    for change in ({"max_num_reqs": 64}, {"max_model_len": 4096}, {"max_num_batched_tokens": 4096},
                   {"pcp_size": 4}, {"num_speculative_tokens": 4}, {"kv_groups": (KvGroup(), KvGroup())},
                   {"max_loras": 64}, {"pp_size": 2},
                   {"cudagraph_mode": "PIECEWISE", "capture_sizes": (64,)}):
        assert bounds.estimate_bytes(RunnerConfig(**{**base.__dict__, **change})) > small, change
    assert bounds.estimate_bytes(RunnerConfig(max_model_len=2**40)) > 10**15
    assert bounds._heaviest_field(RunnerConfig(max_model_len=2**40)) == "config.max_model_len"
    assert bounds._heaviest_field(RunnerConfig(max_num_reqs=10**9)) == "config.max_num_reqs"
    assert bounds._heaviest_field(RunnerConfig(max_num_batched_tokens=10**9)) == \
        "config.max_num_batched_tokens"
    assert bounds._heaviest_field(RunnerConfig(pcp_size=10**5)) == "config.pcp_size"
    assert bounds._heaviest_field(RunnerConfig(max_loras=10**9)) == "config.max_loras"
    assert bounds._heaviest_field(RunnerConfig(pp_size=10**9)) == "config.pp_size"
    assert bounds.format_bytes(2_100_000_000_000) == "2.1 TB" and bounds.format_bytes(512) == "512 B"
    assert bounds.format_bytes(10**40) == "10^40 B"
    assert bounds.parse_byte_count("6G") == 6 << 30 and bounds.parse_byte_count("123") == 123


def test_the_bundled_corpus_fits_well_inside_a_laptop():
    """Every bundled trace's config estimates under 256 MB (the check refuses only
    configs that cannot run)."""
    paths = [p for d in ("samples", "recorded", "regressions") for p in trace_files_in(ROOT / "traces" / d)]
    assert len(paths) >= 15
    for path in paths:
        header, _ = read_trace(path)
        assert bounds.estimate_bytes(header.config) < 256 << 20, path


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(config=runner_configs())
def test_the_fuzz_strategies_draw_only_configs_within_the_bounds(config):
    # PP or PCP: the modules they load on first use count 48 MB alone
    assert bounds.estimate_bytes(config) < 128 << 20
    assert bounds.estimate_seconds(config) < 10
    assert bounds.max_line_bytes(config) < 8 << 20
    bounds.check_config(config, "drawn")  # raises TraceError past a bound



def test_a_pcp_size_the_machine_cannot_hold_is_refused_before_vllm_runs(tmp_path):
    """The reader holds the trace's own config to the machine; --pcp-sizes replays it as
    others, each held to the machine before anything runs (one line, exit 2, no report)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from simrig.trace_io.bounds import estimate_bytes
    from simrig.trace_io.trace import TraceReader

    trace = Path(__file__).resolve().parents[1] / "traces" / "samples" / "chunked_prefill.jsonl"
    reader = TraceReader(trace)
    own = reader.header.config
    reader.close()
    limit = (estimate_bytes(own) + estimate_bytes(own.replayed_as(8, None))) // 2  # PCP 1 fits, 8 not
    out = tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "simrig", "replay", "--no-coverage", str(trace), "--pcp-sizes", "1,8",
                           "--out", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SIMRIG_MEMORY_LIMIT_BYTES": str(limit)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--pcp-sizes" in lines[0] and "at pcp size 8" in lines[0] and "would allocate" in lines[0]
    assert not out.exists()
