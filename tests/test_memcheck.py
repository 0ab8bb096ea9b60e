"""simrig/triton_memcheck/memcheck.py: every load, store and atomic of an
interpreted kernel checked against its launch's allocations before it runs,
narrow integer arithmetic checked for overflow; on the real MRV2 path, quiet on
the bundled traces and loud (a named finding) on a seeded out-of-bounds store."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simrig.triton_memcheck import memcheck

if importlib.util.find_spec("triton") is None:
    pytest.skip("no Triton", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
triton = tl = torch = interpreter = None  # set by _triton, once the platform is chosen
KERNELS: dict[str, object] = {}


@pytest.fixture(autouse=True, scope="module")
def _triton():
    global triton, tl, torch, interpreter
    from simrig.vllm_runtime import platform

    platform.configure()
    import torch as torch_module
    import triton as triton_module
    import triton.language
    from triton.runtime import interpreter as triton_interpreter

    triton, tl, torch, interpreter = triton_module, triton.language, torch_module, triton_interpreter
    _define_kernels()


def _define_kernels() -> None:
    @triton.jit
    def copy_kernel(src_ptr, out_ptr, n_load, n_store, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(src_ptr + offs, mask=offs < n_load, other=-1)
        tl.store(out_ptr + offs, x + 1, mask=offs < n_store)

    @triton.jit
    def scalar_store_kernel(out_ptr, at):
        tl.store(out_ptr + at, 7)  # no mask: one lane

    @triton.jit
    def through_table_kernel(table_ptr, n, BLOCK: tl.constexpr):
        target = tl.load(table_ptr).to(tl.pointer_type(tl.int32))  # a pointer table, as vLLM's block tables
        offs = tl.arange(0, BLOCK)
        tl.store(target + offs, offs, mask=offs < n)

    @triton.jit
    def atomic_kernel(out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.atomic_add(out_ptr + offs, 1, mask=offs < n)

    @triton.jit
    def multiply_kernel(out_ptr, a, b):
        tl.store(out_ptr, a * b)

    @triton.jit
    def hash_kernel(out_ptr, a, b):  # the wrapping uint32 multiply of vLLM's gumbel sampler
        tl.store(out_ptr, (a.to(tl.uint32) * b.to(tl.uint32)).to(tl.int64))

    @triton.jit
    def predicated_rows_kernel(out_ptr, row_of_ptr, num_rows, BLOCK: tl.constexpr):
        # vLLM's grammar-bitmask store: a row's lanes masked by (row active) & (lane's bit) & (in
        # the row), predicates the interpreter combines into integer 0/1 lanes
        row = tl.load(row_of_ptr + tl.program_id(0))
        active = row < num_rows
        offs = tl.arange(0, BLOCK)
        bits = ((offs[:, None] >> tl.arange(0, 2)[None, :]) & 1) == 0
        tl.store(out_ptr + row * 4 + tl.arange(0, 2 * BLOCK) // 2, -1,
                 mask=active & bits.reshape(2 * BLOCK) & (tl.arange(0, 2 * BLOCK) // 2 < 4))

    KERNELS.update(copy=copy_kernel, scalar_store=scalar_store_kernel, through_table=through_table_kernel,
                   atomic=atomic_kernel, multiply=multiply_kernel, hash=hash_kernel,
                   predicated_rows=predicated_rows_kernel)


def _original(fn):
    while hasattr(fn, "__simrig_original__"):
        fn = fn.__simrig_original__
    return fn


@pytest.fixture(params=["speedups", "tritons_own"])
def checked(request, monkeypatch):
    """memcheck installed for the test (removed after it unless the session had it),
    over simrig's launch plumbing (tensors handed over in place) or Triton's own
    (host copies made and copied back); the launch plumbing put back as it was
    after the test, so a registry run later in this process finds Triton's own."""
    from simrig.triton_interpreter import interpreter_launch

    executor = interpreter.GridExecutor
    for name in ("_init_args_hst", "_restore_args_dev"):
        monkeypatch.setattr(executor, name, getattr(executor, name))  # recorded: put back after the test
    interpreter_launch.args_in_place()  # no-op when the platform installed it already
    if request.param == "tritons_own":
        for name in ("_init_args_hst", "_restore_args_dev"):
            monkeypatch.setattr(executor, name, _original(getattr(executor, name)))
    ours = memcheck.install()
    assert memcheck.installed()
    yield request.param
    if ours:
        assert memcheck.uninstall()


def _run(name, grid, *args, **kwargs):
    KERNELS[name][grid](*args, **kwargs)


# ------------------------------------------------------------ unit: small kernels
def test_an_unmasked_store_one_past_the_end_is_named_and_never_happens(checked):
    src, out = torch.arange(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    before = memcheck.stats()["accesses"]
    with pytest.raises(memcheck.KernelMemoryError) as caught:
        _run("copy", (1,), src, out, 8, 9, BLOCK=16)
    message = str(caught.value)
    assert "store out of bounds in copy_kernel: out_ptr[8] outside [0, 8)" in message, message
    assert "(int32, 1 of 9 unmasked lanes; allocation 32 B) at " in message and "test_memcheck.py:" in message
    facts = caught.value.facts
    assert (facts["kernel"], facts["argument"], facts["index"], facts["bounds"], facts["op"]) == (
        "copy_kernel", "out_ptr", 8, (0, 8), "store")
    assert facts["address"] == out.data_ptr() + 32 and (facts["base"], facts["nbytes"]) == (out.data_ptr(), 32)
    assert type(caught.value) is memcheck.KernelMemoryError and isinstance(caught.value, RuntimeError)
    assert out.tolist() == [0] * 8  # raised before the store: not even the lanes in bounds were written
    assert memcheck.stats()["accesses"] >= before + 2  # the load, then the store


def test_a_masked_out_lane_past_the_end_is_no_error(checked):
    src, out = torch.arange(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    _run("copy", (1,), src, out, 8, 8, BLOCK=16)  # lanes 8..15 masked off, load and store
    assert out.tolist() == list(range(1, 9))


def test_a_mask_of_combined_predicates_keeps_lanes_by_truth(checked):
    # row 2 of a 2-row table is inactive: every lane masked, its addresses past the end never
    # counted (a mask of 0/1 integers read as lanes, not as indices into the addresses)
    out = torch.zeros(8, dtype=torch.int32)
    _run("predicated_rows", (3,), out, torch.tensor([0, 1, 2], dtype=torch.int32), 2, BLOCK=4)
    assert out.tolist() == [-1, -1, -1, 0] * 2  # rows 0 and 1: each word but 3 has a clear bit
    with pytest.raises(memcheck.KernelMemoryError, match=r"store out of bounds in predicated_rows_kernel: "
                                                          r"out_ptr\[8\] outside \[0, 8\)"):
        _run("predicated_rows", (1,), out, torch.tensor([2], dtype=torch.int32), 3, BLOCK=4)  # row 2 active


def test_a_load_past_the_end_is_named(checked):
    src, out = torch.arange(8, dtype=torch.int64), torch.zeros(16, dtype=torch.int64)
    with pytest.raises(memcheck.KernelMemoryError, match=r"load out of bounds in copy_kernel: src_ptr\[8\] "
                                                         r"outside \[0, 8\) \(int64, 2 of 10 unmasked"):
        _run("copy", (1,), src, out, 10, 10, BLOCK=16)


def test_a_view_is_checked_against_its_whole_allocation(checked):
    """A kernel handed a slice may reach the rest of its storage (vLLM passes
    row slices with strides); the bounds are the storage's, indexed from the view."""
    base = torch.zeros(10, dtype=torch.int32)
    view = base[2:6]
    _run("scalar_store", (1,), view, 7)  # element 9 of base: inside the allocation
    assert base[9].item() == 7
    with pytest.raises(memcheck.KernelMemoryError, match=r"out_ptr\[-3\] outside \[-2, 8\)"):
        _run("scalar_store", (1,), view, -3)


def test_a_negative_index_is_named_by_the_nearest_argument(checked):
    out = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(memcheck.KernelMemoryError,
                       match=r"store out of bounds in scalar_store_kernel: out_ptr\[-1\] outside \[0, 4\)") as caught:
        _run("scalar_store", (1,), out, -1)
    assert caught.value.facts["address"] == out.data_ptr() - 4


def test_a_pointer_loaded_from_a_table_is_checked_against_the_tensor_it_points_to(checked):
    target = torch.zeros(8, dtype=torch.int32)
    table = torch.tensor([target.data_ptr()], dtype=torch.uint64)  # data_ptr taken outside a launch
    _run("through_table", (1,), table, 8, BLOCK=16)
    assert target.tolist() == list(range(8))
    with pytest.raises(memcheck.KernelMemoryError,
                       match=r"store out of bounds in through_table_kernel: \*table_ptr\[0\]\[8\] outside \[0, 8\)"):
        _run("through_table", (1,), table, 9, BLOCK=16)


def test_a_view_whose_pointer_was_taken_later_does_not_hide_its_table(checked):
    """A short-lived view at the table's address (its first row) has its data_ptr taken after
    the table's: the pointer still resolves to the table's storage once the view is gone."""
    import gc

    target = torch.zeros(8, dtype=torch.int32)
    address = target.data_ptr()
    table = torch.tensor([address], dtype=torch.uint64)
    view = target[:2]
    assert view.data_ptr() == address  # taken last, after the table was built
    del view
    gc.collect()
    _run("through_table", (1,), table, 8, BLOCK=16)
    assert target.tolist() == list(range(8))


def test_atomics_are_checked(checked):
    out = torch.zeros(4, dtype=torch.int32)
    _run("atomic", (1,), out, 4, BLOCK=8)
    assert out.tolist() == [1] * 4
    with pytest.raises(memcheck.KernelMemoryError, match=r"atomic out of bounds in atomic_kernel: out_ptr\[4\]"):
        _run("atomic", (1,), out, 5, BLOCK=8)
    assert out.tolist() == [1] * 4


def test_int32_overflow_in_offset_arithmetic_is_named(checked):
    out = torch.zeros(1, dtype=torch.int32)
    _run("multiply", (1,), out, 40000, 50000)
    assert out.item() == 2_000_000_000
    with pytest.raises(memcheck.KernelOverflowError,
                       match=r"int32 overflow in multiply_kernel: 50000 \* 50000 = 2500000000 "
                             r"outside \[-2147483648, 2147483647\]"):
        _run("multiply", (1,), out, 50000, 50000)
    assert issubclass(memcheck.KernelOverflowError, memcheck.KernelMemoryError)


def test_unsigned_arithmetic_wraps_unchecked(checked):
    out = torch.zeros(1, dtype=torch.int64)
    _run("hash", (1,), out, 1119467026, 3432918353 - (1 << 32))  # the pair a sampler test met
    assert out.item() == (1119467026 * 3432918353) % (1 << 32)


def test_in_bounds_results_are_identical_with_and_without_memcheck(checked):
    import numpy as np

    rng = np.random.default_rng(3)
    src = torch.from_numpy(rng.integers(-1000, 1000, 64).astype(np.int32))
    runs = []
    for on in (True, False):
        if not on and memcheck.installed():
            memcheck.uninstall()
        out = torch.full((64,), 5, dtype=torch.int32)
        for start in (0, 16, 32):
            _run("copy", (1,), src[start:], out[start:], 13, 13, BLOCK=16)
        runs.append(out.clone())
    memcheck.install()
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], torch.full((64,), 5, dtype=torch.int32))


def test_uninstall_puts_back_what_install_replaced(checked):
    if not memcheck.uninstall():
        pytest.fail("installed by the fixture, so uninstall must report it")
    builder = interpreter.interpreter_builder
    assert "create_masked_load" not in vars(builder) and "data_ptr" not in vars(torch.Tensor)
    assert memcheck.install()


# --------------------------------------------------- the real MRV2 path, in a child
CHILD = r"""
import json, sys
from simrig.replay import replay_trace
from simrig.triton_memcheck import memcheck
from simrig.vllm_runtime import mutate
from simrig.vllm_runtime.interpreter_patches import memcheck_ran

trace = sys.argv[1]
clean = replay_trace(trace)
stats = memcheck.stats()
# the pad loop's bound one past the buffer: its last program stores one int64 past slot_mappings
mutate.apply(mutate.Mutant("slot-mappings-past-the-end", "vllm.v1.worker.gpu.block_table",
                           "BlockTables.compute_slot_mappings", "slot_mappings.shape[1],",
                           "slot_mappings.shape[1] + 1,", "seeded out-of-bounds store"))
seeded = replay_trace(trace)
cols = ["kind", "step", "stage", "exception_type", "message"]
print(json.dumps({"installed": memcheck.installed(), "ran": memcheck_ran(), "stats": stats,
                  "clean": clean.findings[cols].to_dict("records"),
                  "seeded": seeded.findings[cols].to_dict("records")}, default=str))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("speedups", ["1", pytest.param("0", marks=pytest.mark.slow)])
def test_mrv2_kernels_are_clean_and_a_seeded_overrun_is_a_named_finding(speedups):
    env = dict(os.environ, SIMRIG_MEMCHECK="1", SIMRIG_INTERPRETER_SPEEDUPS=speedups)
    trace = REPO / "traces" / "samples" / "chunked_prefill.jsonl"
    done = subprocess.run([sys.executable, "-c", CHILD, str(trace)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["installed"] and got["ran"]  # what a report's "memcheck" says: the registry entry installed
    stats = got["stats"]
    assert stats["launches"] > 10 and stats["accesses"] > 100 and stats["overflow_checks"] > 0, stats
    assert stats["unchecked_launches"] == 0
    assert not [f for f in got["clean"] if f["exception_type"]], got["clean"]
    errors = [f for f in got["seeded"] if f["exception_type"] == "KernelMemoryError"]
    assert errors, got["seeded"]
    first = errors[0]
    assert (first["kind"], first["stage"], first["step"]) == ("exception", "prepare", 0)
    assert ("store out of bounds in _compute_slot_mappings_kernel: slot_mappings_ptr[64] outside [0, 64) "
            "(int64, 1 of") in first["message"], first["message"]
    assert "vllm/v1/worker/gpu/block_table.py:" in first["message"]


def test_the_memcheck_flag_sets_the_checker_for_this_process_and_its_workers(monkeypatch, capsys):
    from simrig.cli import main
    from simrig.cli.flags import memcheck_env

    # a copy of the environment: a failing assertion inside the block must not leave the
    # checker on for a later vLLM import in this worker
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "SIMRIG_MEMCHECK"})
    with memcheck_env(True):
        assert os.environ["SIMRIG_MEMCHECK"] == "1"
    assert "SIMRIG_MEMCHECK" not in os.environ  # put back after the command
    with memcheck_env(False):  # --no-memcheck: off for the command and its children
        assert os.environ["SIMRIG_MEMCHECK"] == "0"
    assert "SIMRIG_MEMCHECK" not in os.environ
    os.environ["SIMRIG_MEMCHECK"] = "1"  # a user's own setting: the flag decides, then it is back
    with memcheck_env(False):
        assert os.environ["SIMRIG_MEMCHECK"] == "0"
    assert os.environ["SIMRIG_MEMCHECK"] == "1"
    for command in ("replay", "fuzz", "selftest"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--memcheck, --no-memcheck" in capsys.readouterr().out


def test_selftest_children_run_under_memcheck_unless_turned_off(monkeypatch):
    import argparse

    from simrig.cli import selftest_cmd as selftest

    seen = []
    monkeypatch.setattr(selftest, "_run", lambda args: seen.append(os.environ.get("SIMRIG_MEMCHECK")) or 0)
    monkeypatch.delenv("SIMRIG_MEMCHECK", raising=False)
    assert selftest.run(argparse.Namespace(memcheck=True)) == 0
    assert selftest.run(argparse.Namespace(memcheck=False)) == 0
    assert seen == ["1", "0"] and "SIMRIG_MEMCHECK" not in os.environ  # put back after


# --------------------------------------------------- whether it ran: summary.json, the facts line, history
def test_memcheck_ran_is_the_registry_entry_installed_not_the_request(monkeypatch):
    from simrig.triton_interpreter import registry
    from simrig.vllm_runtime import interpreter_patches

    for states, expected in [
            ([], False),  # CUDA mode, or vLLM never loaded here: no patch at all
            ([registry.PatchState("faster", registry.INSTALLED, "")], False),
            ([registry.PatchState("memcheck", registry.SKIPPED, "Triton 9.9.9 is not one it is known good on")],
             False),
            ([registry.PatchState("memcheck", registry.FAILED, "start-up check: output differs")], False),
            ([registry.PatchState("faster", registry.INSTALLED, ""),
              registry.PatchState("memcheck", registry.INSTALLED, "")], True)]:
        monkeypatch.setattr(registry, "patch_states", lambda states=states: list(states))
        assert interpreter_patches.memcheck_ran() is expected, states


def test_the_facts_line_ends_with_memcheck_on_or_off():
    from simrig.report.html import verdict_section

    facts = "replayed 12 steps from 1 trace(s)"
    assert f"<p class='facts'>{facts}; memcheck on</p>" in verdict_section("t", {"memcheck": True}, facts)
    assert f"<p class='facts'>{facts}; memcheck off</p>" in verdict_section("t", {"memcheck": False}, facts)
    assert "memcheck" not in verdict_section("t", {}, facts)  # a report of another command says nothing


def test_a_campaign_summary_says_whether_memcheck_ran(monkeypatch):
    from simrig.campaign import fuzz

    for ran in (True, False):
        monkeypatch.setattr(fuzz, "memcheck_ran", lambda ran=ran: ran)
        campaign = fuzz.Campaign(fuzz.CampaignOptions(max_examples=1, budget_s=None, progress="quiet"))
        assert campaign.summary()["memcheck"] is ran


def test_a_sharded_campaign_says_memcheck_as_its_shards_ran():
    from types import SimpleNamespace

    from simrig.campaign.fuzz import CampaignOptions
    from simrig.distributed.fuzz_shards import ShardedCampaign

    sharded = ShardedCampaign(CampaignOptions(max_examples=1, budget_s=None, progress="quiet"), 2)
    assert sharded.merged.summary()["memcheck"] is False  # no shard reported: nothing was checked
    def shard(memcheck: bool) -> SimpleNamespace:
        return SimpleNamespace(memcheck=memcheck, vllm_version="0.33.0", device="cpu")

    sharded.results = {"s0": shard(True), "s1": shard(True)}
    assert sharded.merged.summary()["memcheck"] is True  # the driver ran no kernel; its shards did
    sharded.results["s1"] = shard(False)
    assert sharded.merged.summary()["memcheck"] is False


def test_a_selftest_records_memcheck_as_its_children_ran(tmp_path, monkeypatch, capsys):
    from simrig.cli import main
    from simrig.history.store import load_history
    from simrig.selftest import mutant_runs

    store = tmp_path / "history"
    monkeypatch.setenv("SIMRIG_HISTORY", str(store))
    for name, ran in [("all-checked", [True, True]), ("one-unchecked", [True, False])]:
        answers = iter(ran)
        monkeypatch.setattr(mutant_runs, "run_child", lambda mutant, **kw: mutant_runs.ChildResult(
            mutant=mutant, detected=mutant != mutant_runs.BASELINE, via="fuzz:valid", phase="fuzz-valid",
            seconds_to_detection=1.0, kind="dtype_drift", shrunk_steps=2, memcheck=next(answers)))
        out = tmp_path / name
        assert main(["selftest", "--mutants", "idx-mapping-host-int32", "--budget-per-mutant", "5",
                     "--fuzz-only", "--out", str(out), "--quiet"]) == 0, capsys.readouterr()
        assert json.loads((out / "summary.json").read_text())["memcheck"] is all(ran)
        assert f"memcheck {'on' if all(ran) else 'off'}</p>" in (out / "report.html").read_text()
    runs, _ = load_history(store)
    # by report, not by row order: the two runs share a created_utc second more often than not
    assert {Path(r).name: m for r, m in zip(runs["report"], runs["memcheck"])} == {"all-checked": True,
                                                                                  "one-unchecked": False}


@pytest.mark.vllm
def test_a_replay_records_memcheck_in_its_summary_page_and_history_row(vllm_api, tmp_path, monkeypatch, capsys):
    from simrig import replay_run
    from simrig.cli import main
    from simrig.history.store import load_history

    store, out = tmp_path / "history", tmp_path / "rep"
    monkeypatch.setenv("SIMRIG_HISTORY", str(store))
    # this session loaded vLLM before any flag was read: what the registry says is pinned here
    monkeypatch.setattr(replay_run, "memcheck_ran", lambda: True)
    assert main(["replay", str(REPO / "traces" / "samples" / "chunked_prefill.jsonl"), "--stages", "gather",
                 "--no-coverage", "--out", str(out), "--quiet"]) == 0, capsys.readouterr()
    assert json.loads((out / "summary.json").read_text())["memcheck"] is True
    assert "memcheck on</p>" in (out / "report.html").read_text()
    runs, _ = load_history(store)
    assert runs["memcheck"].tolist() == [True]


def test_a_store_written_before_the_memcheck_column_still_reads(tmp_path):
    import pandas as pd

    from simrig.history.store import RUN_COLUMNS, append_run, load_history

    old = tmp_path / "runs" / "20240101T000000Z-aaaaaa.parquet"
    old.parent.mkdir(parents=True)
    pd.DataFrame([{"run_id": "20240101T000000Z-aaaaaa", "command": "replay", "suite": "replay x",
                   "created_utc": "2024-01-01T00:00:00+00:00", "exit_status": 0, "classes": 0, "new": 0,
                   "known": 0, "expected": 0}]).to_parquet(old, index=False)
    append_run(tmp_path, {"command": "replay", "suite": "replay x", "memcheck": True,
                          "created_utc": "2024-01-02T00:00:00+00:00"}, None)
    runs, _ = load_history(tmp_path)
    assert "memcheck" in RUN_COLUMNS and str(runs["memcheck"].dtype) == "boolean"
    assert runs["memcheck"].isna().tolist() == [True, False] and bool(runs["memcheck"].iloc[1])


def test_a_kernel_memory_error_class_s_repro_file_says_it_needs_simrig_s_memcheck():
    from simrig.bisect.search import ClassKey
    from simrig.repro.pytest_file import render

    trace = REPO / "traces" / "samples" / "chunked_prefill.jsonl"
    for exception_type in ("KernelMemoryError", "KernelOverflowError"):
        doc = render(trace, ClassKey("exception", "prepare", "", exception_type)).split('"""')[1]
        assert "This class needs simrig's memcheck to reproduce on CPU" in doc
        assert "\n    compute-sanitizer --tool memcheck python -m pytest THIS_FILE\n" in doc
    other = render(trace, ClassKey("exception", "prepare", "", "KeyError")).split('"""')[1]
    assert "memcheck" not in other  # only the checker's own exception types
