"""Every config the rig cannot hold is refused while the trace is read (issue 48, item 3).

A header's config makes vLLM allocate and loop in proportion to its fields. The reader
holds it to the memory this process can have (``bounds.estimate_bytes``), to the time a
runner may take to start and run one full step (``bounds.estimate_seconds``) and to int32,
before vLLM is imported. The property: a config drawn with fields up to 10^12 is refused
with one line naming a config field, or its estimates fit. The costs pinned below were
measured by hand (vLLM 0.33.0, a 2-core CPU, Triton's interpreter): no estimate may fall
under what a run took. The slow rows run ``simrig replay`` under RLIMIT_AS.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simrig.graph_rules.lora_dispatch import capture_cases
from simrig.host_memory import RUNTIME_MAPPED
from simrig.step import CUDAGRAPH_MODES, KvGroup, RunnerConfig
from simrig.trace_io import bounds
from simrig.trace_io.trace import TraceError, read_trace

_BIN = Path(sys.executable).parent / "simrig"
SIMRIG = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "simrig"]
LIMIT = 8 << 30  # SIMRIG_MEMORY_LIMIT_BYTES of the in-process rows: the same answer on any machine
SMALL = {"max_num_reqs": 4, "max_num_batched_tokens": 64, "max_model_len": 128}  # the measured runs' base
INT_FIELDS = ("max_num_reqs", "max_num_batched_tokens", "max_model_len", "num_speculative_tokens", "pcp_size",
              "dcp_size", "block_size", "max_loras", "pp_size", "num_ubatches", "dbo_decode_token_threshold",
              "dbo_prefill_token_threshold")

SIZES = st.one_of(st.integers(1, 64), st.integers(0, 12).map(lambda k: 10**k), st.integers(1, 10**12))


@st.composite
def header_configs(draw, sizes: st.SearchStrategy[int] = SIZES) -> dict:
    """A header's config as JSON, each size drawn from ``sizes``. Only what vLLM's own
    config refuses anyway is kept out (SchedulerConfig: a token per request slot;
    VllmConfig: more tokens than drafts; no micro-batches with LoRA, drafts, context or
    pipeline parallelism or PIECEWISE graphs; FULL graphs and sliding windows under PCP)."""
    c = {name: draw(sizes) for name in ("max_num_reqs", "max_num_batched_tokens", "max_model_len",
                                         "block_size")}
    for name in ("pcp_size", "dcp_size", "pp_size"):  # most draws without: each refuses most alone
        c[name] = draw(st.one_of(st.just(1), st.just(1), sizes))
    c["num_speculative_tokens"] = draw(st.one_of(st.just(0), sizes))
    c["max_loras"] = draw(st.one_of(st.just(0), sizes))
    c["max_num_batched_tokens"] = max(c["max_num_batched_tokens"], c["max_num_reqs"],
                                      c["num_speculative_tokens"] + 1)
    mode = draw(st.sampled_from(CUDAGRAPH_MODES))
    c["cudagraph_mode"] = "FULL_AND_PIECEWISE" if mode == "FULL" and c["pcp_size"] > 1 else mode
    tokens = c["max_num_batched_tokens"]
    if mode != "NONE":
        c["capture_sizes"] = draw(st.one_of(
            st.just([]), st.lists(st.integers(1, tokens), min_size=1, max_size=6),
            st.integers(1, 200_000).map(lambda n: list(range(1, min(n, tokens) + 1)))))
    c["specialize_active_lora"], c["cudagraph_specialize_lora"] = draw(st.booleans()), draw(st.booleans())
    count = draw(st.sampled_from((1, 1, 2, 3, 100, 10_000, 50_000)))  # the header stays under 4 MiB
    kinds = [st.just({}), st.builds(lambda b: {"block_size": b}, sizes)]
    if c["pcp_size"] == c["dcp_size"] == 1:
        kinds.append(st.builds(lambda w: {"kind": "sliding_window", "window": w}, sizes))
    groups = draw(st.lists(st.one_of(*kinds), min_size=1, max_size=3))
    c["kv_groups"] = (groups * count)[:count]  # many groups repeat a few: a draw apiece would not fit
    n = draw(st.one_of(st.just(1), sizes))
    if n > 1 and not (c["max_loras"] or c["num_speculative_tokens"] or c["pcp_size"] > 1
                      or c["dcp_size"] > 1 or c["pp_size"] > 1 or mode == "PIECEWISE"):
        c["num_ubatches"] = n
        for name in ("dbo_decode_token_threshold", "dbo_prefill_token_threshold"):
            c[name] = n + draw(st.one_of(st.just(0), sizes))
    return c


def _write(path: Path, config: dict, steps: list[dict] = ()) -> Path:
    head = {"format": "simrig-trace", "version": 1, "config": config, "source": {"kind": "hand-written"}}
    path.write_text("".join(json.dumps(x) + "\n" for x in [head, *steps]))
    return path


def _config(**fields) -> RunnerConfig:
    groups = fields.pop("kv_groups", None)
    config = RunnerConfig(**fields, **({"kv_groups": tuple(KvGroup(**g) for g in groups)} if groups else {}))
    config.validate()
    return config


# ------------------------------------------------------------ the property, in process
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(config=header_configs())
def test_a_config_is_refused_naming_a_config_field_or_its_estimates_fit(tmp_path, config):
    path = _write(tmp_path / "t.jsonl", config)
    with mock.patch.dict(os.environ, {bounds.MEMORY_ENV: str(LIMIT)}):
        try:
            header, _ = read_trace(path)
        except TraceError as err:
            assert err.line == 1 and err.field.startswith("config."), str(err)
            return
    read = header.config
    assert bounds.estimate_bytes(read) <= LIMIT
    assert bounds.estimate_seconds(read) <= bounds.MAX_SECONDS
    assert all(getattr(read, name) <= bounds.INT32_MAX for name in INT_FIELDS)
    # the costs measured per unit (MEASURED_BYTES) fit too, whatever the estimate says
    assert read.max_loras * 740 + (read.pp_size * 59 if read.pp_size > 1 else 0) <= LIMIT
    assert read.max_num_batched_tokens * 79 <= LIMIT


# ------------------------------------------------------------ the estimates against measured runs
# (config over SMALL, the growth of the peak resident memory of a process driving it once
# vLLM was loaded, seconds to build the harness and run its start-up and first step)
MEASURED = [
    ({"max_loras": 100_000}, 76.1e6, 1.80),
    ({"max_loras": 200_000}, 148.8e6, 1.48),
    ({"pp_size": 10_000_000}, 594.2e6, 1.58),
    ({"pp_size": 2, "max_loras": 50_000, "cudagraph_mode": "FULL_AND_PIECEWISE"}, 101.0e6, 1.94),
    ({"max_num_batched_tokens": 3_000_000}, 240.2e6, 1.05),
    ({"max_num_batched_tokens": 10**6, "cudagraph_mode": "PIECEWISE", "capture_sizes": (10**6,)},
     435.9e6, 6.92),
    ({"max_num_reqs": 100_000, "max_num_batched_tokens": 100_000}, 1781.3e6, 40.15),
    ({"max_num_reqs": 300_000, "max_num_batched_tokens": 300_000, "max_model_len": 16}, 5178.4e6, 126.35),
    ({"max_num_reqs": 64, "max_model_len": 10**6, "max_num_batched_tokens": 2048}, 303.6e6, 0.33),
    ({"kv_groups": [{}] * 128}, 9.2e6, 0.75),
    ({"pcp_size": 64, "max_num_batched_tokens": 4096}, 60.0e6, 0.48),
    ({"max_loras": 5000, "cudagraph_mode": "FULL_AND_PIECEWISE", "specialize_active_lora": True,
      "max_num_reqs": 64, "max_num_batched_tokens": 2048}, 22.1e6, 1.29),
    # one step of 40000 tokens split into 20000 micro-batches
    ({"max_num_batched_tokens": 80_000, "max_model_len": 80_000, "num_ubatches": 20_000,
      "dbo_decode_token_threshold": 20_000, "dbo_prefill_token_threshold": 20_000}, 42.4e6, 5.83),
]

BASE_SECONDS = 0.06  # SMALL itself, built, started and stepped once


@pytest.mark.parametrize("change, peak_bytes, seconds", MEASURED, ids=[str(m[0])[:60] for m in MEASURED])
def test_no_estimate_falls_under_what_a_run_took(change, peak_bytes, seconds):
    config = _config(**{**SMALL, **change})
    assert bounds.estimate_bytes(config) >= peak_bytes
    assert bounds.estimate_seconds(config) >= seconds - BASE_SECONDS


def test_the_estimate_counts_each_lora_slot_and_the_second_pp_runner():
    base = _config(**SMALL)
    # per LoRA slot: at least the 740 bytes a run took (a dummy run's two sets of warm-up
    # LoRARequests, the dispatch map's entry)
    for n in (1_000, 10**6):
        assert bounds.estimate_bytes(_config(**SMALL, max_loras=n)) - bounds.estimate_bytes(base) >= 740 * n
    # pp_size > 1 builds a second runner: every buffer of the runner twice
    heavy = {**SMALL, "max_num_reqs": 64, "max_model_len": 100_000, "max_num_batched_tokens": 8192}
    one, two = (bounds.estimate_bytes(_config(**heavy, pp_size=p)) for p in (1, 2))
    assert two - one >= 64 * 100_000 * 4 * 2  # its token table [64, 100000] int32, and its copy
    # the candidate map: an entry per token count up to the largest capture size
    graphs = {**SMALL, "cudagraph_mode": "PIECEWISE", "max_num_batched_tokens": 10**6}
    small, large = (bounds.estimate_bytes(_config(**graphs, capture_sizes=(s,))) for s in (1, 10**6))
    assert large - small >= 354 * 10**6  # what a run took per entry


@pytest.mark.parametrize("loras, specialize, cudagraph_specialize", [
    (0, False, True), (1, False, True), (7, True, True), (8, True, True), (1000, True, True),
    (1000, True, False), (1000, False, True), (2**20 - 1, True, True)])
def test_the_lora_cases_counted_are_at_least_the_oracles(loras, specialize, cudagraph_specialize):
    config = RunnerConfig(max_loras=loras, specialize_active_lora=specialize,
                          cudagraph_specialize_lora=cudagraph_specialize)
    assert bounds._lora_cases(config) >= len(capture_cases(config))


# ------------------------------------------------------------ refusals, one line each
def _refusal(tmp_path: Path, config: dict, limit: int = LIMIT) -> TraceError:
    with mock.patch.dict(os.environ, {bounds.MEMORY_ENV: str(limit)}), pytest.raises(TraceError) as err:
        read_trace(_write(tmp_path / "t.jsonl", config))
    return err.value


def test_a_billion_lora_slots_are_refused_on_line_1_naming_max_loras(tmp_path):
    err = _refusal(tmp_path, {"max_loras": 10**9})
    assert (err.line, err.field) == (1, "config.max_loras")
    assert err.problem.startswith("the runner would allocate about ")
    assert err.problem.endswith(f" TB for this config; {bounds.MEMORY_ENV} allows 8.6 GB")


# (config, the fields that hold the loop): the profile run's requests are the fewer of
# max_num_reqs and the token budget, and a batch splits only within the budget
@pytest.mark.parametrize("config, fields", [
    ({"kv_groups": [{}] * 10_000}, {"config.kv_groups"}),  # ~4 ms a group in every step
    ({"max_num_reqs": 10**6, "max_num_batched_tokens": 10**6, "max_model_len": 1},
     {"config.max_num_reqs", "config.max_num_batched_tokens"}),
    ({"max_loras": 10**7}, {"config.max_loras"}),
    ({"max_num_batched_tokens": 10**6, "max_model_len": 10**6, "num_ubatches": 10**6,
      "dbo_decode_token_threshold": 10**6, "dbo_prefill_token_threshold": 10**6},
     {"config.num_ubatches", "config.max_num_batched_tokens"}),
    ({"cudagraph_mode": "PIECEWISE", "max_num_batched_tokens": 100_000,
      "capture_sizes": list(range(1, 100_001))}, {"config.capture_sizes"}),
])
def test_what_would_loop_for_minutes_is_refused_naming_its_field(tmp_path, config, fields):
    """Memory is no object here (1 TB allowed): the start-up time refuses each."""
    err = _refusal(tmp_path, config, limit=10**12)
    assert err.line == 1 and err.field in fields
    assert err.problem.startswith("the runner would take about ")
    assert err.problem.endswith(f"to start and run one full step of this config on a CPU, past the "
                                f"{bounds.MAX_SECONDS} s a config is given")


def test_the_memory_left_is_read_less_what_loading_vllm_maps(monkeypatch):
    """Under RLIMIT_AS the process keeps room for vLLM, torch and Triton, loaded after the
    trace is read (a one-step replay needs about 1.3 GB of address space on a 2-core CPU)."""
    monkeypatch.delenv(bounds.MEMORY_ENV, raising=False)
    assert RUNTIME_MAPPED >= 1300 << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status").read_text().splitlines()
    mapped = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize"))
    cap = mapped + (16 << 30)  # room to go on allocating while the limit holds
    if hard != resource.RLIM_INFINITY and hard < cap:
        pytest.skip("the hard RLIMIT_AS leaves no 16 GiB to set a limit in")
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        found = bounds.available_memory()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert found is not None and found[0] <= cap - RUNTIME_MAPPED


# ------------------------------------------------------------ simrig replay under RLIMIT_AS
CAP = 4 << 30  # RLIMIT_AS of the replays below


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def _replay(paths: list[Path], out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop(bounds.MEMORY_ENV, None)
    return subprocess.run([*SIMRIG, "replay", *map(str, paths), "--no-coverage", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600, preexec_fn=_cap,
                          cwd=out.parent)


def _one_step(config: RunnerConfig) -> dict:
    """One request of a few tokens with a block per group for them."""
    n = min(4, config.max_model_len, config.max_num_batched_tokens)
    groups, first = [], 1
    for g in range(config.num_kv_groups):
        count = -(-n // config.group_block_size(g))
        groups.append(list(range(first, first + count)))
        first += count
    blocks = groups[0] if len(groups) == 1 else groups
    return {"new_requests": [{"id": "a", "prompt_len": n, "block_ids": blocks}],
            "num_scheduled_tokens": {"a": n}}


def _passes(config: dict) -> bool:
    """Whether the reader accepts ``config`` with the memory a replay under CAP has left."""
    left = CAP - RUNTIME_MAPPED - (512 << 20)  # the reader's own interpreter besides
    sizes = tuple(config.get("capture_sizes", ()))
    try:
        with mock.patch.dict(os.environ, {bounds.MEMORY_ENV: str(left)}):
            bounds.check_config(_config(**{**config, "capture_sizes": sizes}), "drawn")
    except (TraceError, ValueError):
        return False
    return True


# sizes up to 10^6, so that a few draws pass the reader under CAP
PASSING = header_configs(st.one_of(st.integers(1, 64), st.integers(0, 6).map(lambda k: 10**k),
                                   st.integers(1, 10**6))).filter(_passes)


@pytest.mark.slow
@settings(max_examples=1, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(configs=st.lists(PASSING, min_size=2, max_size=2, unique_by=lambda c: json.dumps(c, sort_keys=True)))
def test_drawn_configs_the_reader_passes_replay_within_rlimit_as(tmp_path_factory, configs):
    """Two drawn configs the reader accepts (unique: not the simplest draw twice) replay,
    each in a process capped at 4 GiB of address space: exit 0, 1 or 2 (2: the reader's own
    reading of what is left), never a rig error from an allocation; the 10^9 LoRA header is
    one line, exit 2."""
    tmp = tmp_path_factory.mktemp("rlimit")
    for i, config in enumerate(configs):
        read = _config(**{**config, "capture_sizes": tuple(config.get("capture_sizes", ()))})
        proc = _replay([_write(tmp / f"drawn{i}.jsonl", config, [_one_step(read)])], tmp / f"out{i}")
        assert proc.returncode in (0, 1, 2), proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "MemoryError" not in proc.stdout + proc.stderr
    huge = _write(tmp / "loras.jsonl", {"max_loras": 10**9}, [_one_step(RunnerConfig())])
    proc = _replay([huge], tmp / "out_loras")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert f"{huge}:1: config.max_loras: the runner would allocate about " in proc.stderr
