'''The standalone pytest file ``simrig repro`` writes: three sections, as text.

    @@DOC@@     the module docstring (class, property, where, how to run)
    RUNNER      a CPU runner (cpu_runner.py) and the drive helpers: a step through execute_model
                and the dummy paths (drive.py)
    @@DATA@@    CONFIG, CLASS and STEPS as Python literals: the minimal schedule
    PROPERTY    the drive (execute_model per step; profile_run, capture_model, _dummy_run where
                the class lives) and the assertion
The file imports only vLLM, torch, numpy, pytest and the standard library (no simrig); it adapts
to the installed release by looking at signatures. (A sampling class: simrig/repro_sampling/ instead.)
'''

from simrig.repro.cpu_runner import RUNNER
from simrig.repro.drive import DRIVE

HEAD = r'''"""@@DOC@@"""
import contextlib
import dataclasses
import gc
import inspect
import json
import math
import os
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
'''

PROPERTY = r'''

# ============================================================ the property
def mode(desc):
    return getattr(desc.cg_mode, "name", str(desc.cg_mode))


def dtype_of(value):
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, np.ndarray):
        return f"numpy.{value.dtype}"
    return type(value).__name__


def field(batch, name):
    for part in name.split("."):
        batch = getattr(batch, part, None)
    return batch


def drive(runner):
    """What the worker runs, in its order: the profile run and graph capture at
    start-up (where the class lives there), then every step through execute_model,
    each followed by the dummy run an idle data-parallel rank would make."""
    dispatched = dispatches(runner)
    if CLASS["stage"] == "profile":
        profile_run(runner)
    captured = []
    if CLASS["stage"] == "capture" and runner.cudagraph_manager.needs_capture():
        capture_model(runner)
        # the descriptors vLLM captured graphs for (its own list, per mode)
        captured = [d for descs in runner.cudagraph_manager._capture_descs.values() for d in descs]
    runner.cudagraph_manager._graphs_captured = True  # dispatch as after the start-up capture
    steps = []
    for index, step in enumerate(STEPS):
        first, first_lora = len(dispatched), len(runner.lora_manager.activations)
        run_step(runner, step)
        steps.append(SimpleNamespace(index=index, step=step, descs=dispatched[first:],
                                     lora=runner.lora_manager.activations[first_lora:],
                                     batch=getattr(runner, "forward_batch", None)))
        if CLASS["stage"] == "dummy" and step["num_scheduled_tokens"] and step.get("idle_dummy", True):
            dummy_run(runner, sum(step["num_scheduled_tokens"].values()))
    return steps, captured


def at_stage(seen):
    """The batches of the class's stage (prepare: the real steps' batches)."""
    path = {"prepare": "step", "partition": "step"}.get(CLASS["stage"], CLASS["stage"])
    records = [r for r in seen if r.path == path]
    assert records, f"no batch of stage {CLASS['stage']} reached the forward"
    return records


def where(record):
    return {"step": "execute_model", "dummy": "_dummy_run", "profile": "profile_run",
            "capture": "capture_model"}[record.path]


def check_dtype(seen):
    real = [r for r in seen if r.path == "step"]
    for r in at_stage(seen):
        value = field(r.batch, CLASS["field"])
        if real and r.path != "step":
            expected = dtype_of(field(real[-1].batch, CLASS["field"]))
            assert dtype_of(value) == expected, (
                f"{where(r)}: InputBatch.{CLASS['field']} is {dtype_of(value)}, the real batch's "
                f"(execute_model) is {expected}: a graph captured on this batch and replayed with "
                f"the real one sees two dtypes. Expected {CLASS['declared']}: {CLASS['meaning']}")
        assert value is None or dtype_of(value) == CLASS["declared"], (
            f"{where(r)}: InputBatch.{CLASS['field']} is {dtype_of(value)}, expected "
            f"{CLASS['declared']}: {CLASS['meaning']}")


def check_present(seen):
    real = [r for r in seen if r.path == "step" and field(r.batch, CLASS["field"]) is not None]
    assert real, f"the schedule never makes execute_model build InputBatch.{CLASS['field']}"
    for r in at_stage(seen):
        assert field(r.batch, CLASS["field"]) is not None, (
            f"{where(r)}: InputBatch.{CLASS['field']} is None where the real batch (execute_model) "
            f"has {dtype_of(field(real[-1].batch, CLASS['field']))}: {CLASS['meaning']}")


def check_positions(seen):
    for r in at_stage(seen):
        b = r.batch
        qsl = b.query_start_loc_np[: b.num_reqs + 1] if hasattr(b, "query_start_loc_np") \
            else b.query_start_loc[: b.num_reqs + 1].cpu().numpy()
        seq_lens = b.seq_lens[: b.num_reqs].cpu().numpy()
        expected = np.concatenate([np.arange(s - (e - a), s) for a, e, s in zip(qsl[:-1], qsl[1:], seq_lens)])
        got = b.positions[: len(expected)].cpu().numpy()
        bad = np.flatnonzero(got != expected)
        assert bad.size == 0, (
            f"{where(r)}: InputBatch.positions[{bad[0]}] is {got[bad[0]]}, expected {expected[bad[0]]} "
            f"(row by row: seq_len - query_len + j; first rows expected {expected[:8].tolist()}, got "
            f"{got[:8].tolist()}): {CLASS['meaning']}")


def check_block_tables(seen):
    size = CONFIG["block_size"]
    for r in (r for r in seen if r.path == "step"):
        b = r.batch
        computed = (b.seq_lens[: b.num_reqs].cpu().numpy()
                    - np.diff(b.query_start_loc[: b.num_reqs + 1].cpu().numpy()))
        for g, group in enumerate(CONFIG["kv_groups"]):
            if group["kind"] != "sliding_window":
                continue
            for i, req_id in enumerate(b.req_ids):
                below = max(int(computed[i]) - (group["window"] - 1), 0) // size
                row = r.block_tables[g][i, :below].cpu().tolist()
                assert all(x == 0 for x in row), (
                    f"execute_model: request {req_id}, KV group {g} (sliding window {group['window']}): "
                    f"its first scheduled position is {int(computed[i])}, so blocks 0..{below - 1} lie "
                    f"wholly below the window and must be the null block 0; the forward's block table "
                    f"holds {row}: {CLASS['meaning']}")


def check_rows_past(seen):
    group = int(CLASS["field"].rsplit(".", 1)[1])
    for r in at_stage(seen):
        past = r.rows_past[group] if group < len(r.rows_past) else []
        assert not past, (
            f"{where(r)}: rows {past} of KV group {group}'s persistent block table, past the "
            f"{r.block_tables[group].shape[0]} rows handed to attention, still hold block ids a larger "
            f"earlier batch gathered there: {CLASS['meaning']}")


def check_full_decode(steps):
    sizes = list(runner_sizes())
    for s in steps:
        nst = s.step["num_scheduled_tokens"]
        decodes = all(n == 1 for n in nst.values()) and not s.step["new"] and nst
        local = math.ceil(len(nst) / CONFIG["pcp_size"])
        if not (decodes and sizes and local <= max(sizes)):
            continue
        desc = s.descs[-1]
        assert mode(desc) == "FULL", (
            f"step {s.index}: a decode-only batch of {len(nst)} requests (at most {local} per PCP rank "
            f"of {CONFIG['pcp_size']}) fits the FULL decode graphs (capture sizes {sizes}), but "
            f"execute_model dispatched {mode(desc)} (num_tokens={desc.num_tokens}, "
            f"num_reqs={desc.num_reqs}): {CLASS['meaning']}")


def check_lora(steps, captured):
    if CLASS["stage"] == "capture":
        free = [d for d in captured if getattr(d, "num_active_loras", None) == 0]
        assert captured and not free, (
            f"capture_model captured {len(free)} LoRA-free graph(s) (num_active_loras=0) with "
            f"cudagraph_specialize_lora=False: {CLASS['meaning']}")
        return
    for s in steps:
        for desc in s.descs:
            assert getattr(desc, "num_active_loras", None) != 0, (
                f"step {s.index}: execute_model dispatched a LoRA-free graph (num_active_loras=0, "
                f"{mode(desc)}) with cudagraph_specialize_lora=False: {CLASS['meaning']}")


def check_lora_mapping(steps):
    """What execute_model hands _set_active_loras: each batch row (prompt_mapping) and each
    scheduled token (token_mapping) maps to its request's adapter id, 0 for none; the
    active set is the batch's distinct adapters."""
    name, adapter = CLASS["field"].split(".", 1)[1], {}
    for s in steps:
        for r in s.step["finished"] + s.step["preempted"]:
            adapter.pop(r, None)
        adapter.update({q["id"]: q.get("lora_id") or 0 for q in s.step["new"]})
        if not s.lora or s.batch is None:
            continue
        requests, mapping = s.lora[-1]
        rows = [adapter.get(r, 0) for r in s.batch.req_ids]
        counts = [int(n) for n in s.batch.num_scheduled_tokens[:len(rows)]]
        want = {"prompt_mapping": rows, "token_mapping": [a for a, n in zip(rows, counts) for _ in range(n)],
                "active_ids": sorted({a for a in rows if a})}[name]
        got = {"prompt_mapping": [int(a) for a in mapping.prompt_mapping],
               "token_mapping": [int(a) for a in mapping.index_mapping],
               "active_ids": sorted(int(r.lora_int_id) for r in requests)}[name]
        assert got == want, (
            f"step {s.index}: execute_model handed _set_active_loras {name} {got}; the batch's requests "
            f"{list(s.batch.req_ids)} run adapters {rows} (0: none), so it should be {want}: "
            f"{CLASS['meaning']}")


def runner_sizes():
    return [int(x) for x in RUNNER_CONFIG.compilation_config.cudagraph_capture_sizes or ()]


def test_@@TEST@@(tmp_path):
    global RUNNER_CONFIG
    runner = build_runner(str(tmp_path))
    RUNNER_CONFIG = runner.vllm_config
    # The property fails as an AssertionError; anything else is the file's own trouble.
    raised = None
    try:
        steps, captured = drive(runner)
    except Exception as exc:  # judged below, outside the handler (a clean traceback)
        raised = exc
    if CLASS["property"] == "raises":
        assert raised is not None, (f"the runner accepted the schedule silently (no "
                                    f"{CLASS['exception_type']} in {len(STEPS)} step(s)): {CLASS['meaning']}")
        assert CLASS["exception_type"] in ("Exception", type(raised).__name__), (
            f"the runner raised {type(raised).__name__}: {raised}, expected {CLASS['exception_type']}: "
            f"{CLASS['meaning']}")
        return
    if raised is not None:
        message = (f"the runner raised {type(raised).__name__}: {raised} on a schedule that keeps the "
                   "scheduler's contract")
        assert CLASS["property"] != "no_raise", f"{message}: {CLASS['meaning']}"
        pytest.fail(f"{message}, before the property could be checked")
    seen = runner.model_state.seen
    {"dtype": lambda: check_dtype(seen), "present": lambda: check_present(seen),
     "positions": lambda: check_positions(seen), "block_tables": lambda: check_block_tables(seen),
     "rows_past": lambda: check_rows_past(seen),
     "full_decode": lambda: check_full_decode(steps), "lora": lambda: check_lora(steps, captured),
     "lora_mapping": lambda: check_lora_mapping(steps),
     "no_raise": lambda: None}[CLASS["property"]]()
'''

RUNNER_SECTION = RUNNER + DRIVE


def assemble(doc: str, data: str, test: str) -> str:
    """The file's text: header, the CPU runner, the schedule, the property."""
    return (HEAD.replace("@@DOC@@", doc) + RUNNER_SECTION
            + "\n\n# ============================================================ the schedule\n"
            + data + "\n" + PROPERTY.replace("@@TEST@@", test))
