"""Observing vLLM by wrapping: the harness's probes and what they record.

A probe shadows one method on one instance (``wrap``); the shadow calls the
class's current function, so a mutated vLLM is what runs, and passes the
arguments and the result through unchanged. The capture tap inserts a class
between the cudagraph manager's class and its base for the length of one
capture, to learn which descriptor each capture dummy is built for.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from simrig import observe as obs
from simrig.step import Step
from simrig.vllm_parts import cudagraph


def wrap(obj: Any, name: str, probe: Any) -> None:
    """Shadow ``obj.name`` on the instance with ``probe(call, *args)``; ``call``
    looks the class's function up at call time, so a mutated vLLM runs."""
    owner = type(obj)

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(owner, name)(obj, *args, **kwargs)

    setattr(obj, name, lambda *args, **kwargs: probe(call, *args, **kwargs))


def tap_capture_descriptors(manager: Any, on_desc: Any) -> Any:
    """For one capture: tell ``on_desc`` which descriptor each dummy is built
    for. CudaGraphManager.capture calls ``create_forward_fn(desc, ...)`` per
    descriptor; a class inserted between the manager's class and the base
    wraps that factory and calls the base's current capture unchanged."""
    cls = type(manager)
    base = next(k for k in cls.__mro__[1:] if "capture" in vars(k))

    class Tap(base):  # type: ignore[misc, valid-type]
        def capture(self, create_forward_fn: Any, *args: Any, **kwargs: Any) -> Any:
            def tapped(desc: Any, *a: Any, **kw: Any) -> Any:
                on_desc(desc)
                return create_forward_fn(desc, *a, **kw)
            return super().capture(tapped, *args, **kwargs)

    @contextlib.contextmanager
    def tapped_class() -> Any:
        manager.__class__ = type(cls.__name__, (cls, Tap), {})
        try:
            yield
        finally:
            manager.__class__ = cls

    return tapped_class()


def descriptor_fields(desc: Any, prefix: str = "") -> dict[str, obs.FieldObs]:
    """A BatchExecutionDescriptor's fields as observations: the dispatch
    stage's own, or ``desc.``-prefixed on the dummy or capture record it was
    built for."""
    return {prefix + k: obs.observe_value(v) for k, v in cudagraph.describe(desc).items()}


def desc_key(desc: Any) -> tuple:
    return tuple(sorted(cudagraph.describe(desc).items()))


def observe_batch(record: obs.StageObs, batch: Any) -> None:
    record.fields = obs.observe_fields(batch)
    record.declared = obs.declared_fields(batch)


def pcp_private_view(manager: Any) -> dict[str, obs.FieldObs]:
    """The manager's restore/gather index arrays (global = gathered[restore])."""
    out = {}
    for name in ("_hidden_restore_idx", "_padded_gather_idx", "_gathered_kv_write_mask"):
        # None is observed too: the contract decides whether it may be None.
        out["manager." + name.lstrip("_")] = obs.observe_value(getattr(manager, name, None))
    return out


def error_obs(exc: Exception, step: Step) -> obs.ErrorObs:
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        req_ids: tuple[str, ...] = (exc.args[0],)
    else:
        req_ids = tuple(step.num_scheduled_tokens)
    return obs.ErrorObs(type=type(exc).__name__, message=str(exc)[:500], req_ids=req_ids)


def filled_rows_past(table: Any) -> Any:
    """The rows of the shared table that ``table`` is the head of, past ``table``'s
    own rows, that hold any block id: their indices in the shared table.

    vLLM hands attention ``input_block_tables[g][:n]``, a view of the persistent
    forward-pass table ("Block tables used for model's forward pass.
    num_kv_cache_groups x [max_num_reqs, max_num_blocks]"); the rows past ``n``
    are read by nothing this step but stay in the buffer a later, larger batch
    or graph replay reads. None when ``table`` is not a head view of a 2-D buffer
    (then there is nothing past it to see)::

        shared buffer   [ r0 | r1 | r2 | r3 | r4 | r5 ]   max_num_reqs rows
        handed over     [ r0 | r1 | r2 ]                   n = 3
        observed        rows 3..5 holding any id != 0   -> e.g. [3, 4]
    """
    import torch  # lazy: torch loads only when this runs

    base = getattr(table, "_base", None)
    if not isinstance(table, torch.Tensor) or base is None or base.dim() != 2 or table.dim() != 2:
        return None
    if (table.storage_offset() != base.storage_offset() or table.stride() != base.stride()
            or table.shape[1] != base.shape[1]):
        return None
    past = base[table.shape[0]:]
    return (torch.nonzero(past.ne(0).any(dim=1)).flatten() + table.shape[0]).numpy().astype(np.int64)


def attn_fields(block_tables: Any, slot_mappings: Any) -> dict[str, obs.FieldObs]:
    """prepare_attn's outputs as observed fields, the same for a real batch and a dummy:
    each KV cache group's block table, the shared table's rows past it that still hold
    a block id (``filled_rows_past``), and the slot mappings (blocks.py and
    graph_rules/padded_attn.py judge them)."""
    fields: dict[str, obs.FieldObs] = {}
    for group, table in enumerate(block_tables or ()):
        fields[f"attn.block_tables.{group}"] = obs.observe_value(table)
        past = filled_rows_past(table)
        if past is not None:
            fields[f"{obs.ROWS_PAST}.{group}"] = obs.observe_value(past)
    if slot_mappings is not None:
        fields["attn.slot_mappings"] = obs.observe_value(slot_mappings)
    return fields


def lora_fields(prompt_mapping: Any, token_mapping: Any, lora_requests: Any) -> dict[str, obs.FieldObs]:
    """``_set_active_loras``'s arguments as observed fields: the per-request and
    per-token adapter ids (plain ints, 0 for none) and the active adapters'
    ids, sorted (graph_rules/lora_inputs.py judges them)."""
    return {"lora.prompt_mapping": obs.observe_value([int(i) for i in prompt_mapping]),
            "lora.token_mapping": obs.observe_value([int(i) for i in token_mapping]),
            "lora.active_ids": obs.observe_value(sorted(int(r.lora_int_id) for r in lora_requests))}

def added_state(runner: Any, step: Any) -> dict[str, Any]:
    """The runner's state of each request this step added (a streaming update included),
    read after ``add_requests`` and ``update_requests``, in the step's order: what the
    runner keeps per slot from the ``NewRequestData`` (``RequestState.add_request`` and
    ``BlockTables.append_block_ids``). Requests the runner does not hold are left out."""
    states, tables = runner.req_states, runner.block_tables
    held = states.req_id_to_index
    ids = [r.req_id for r in step.new_requests if r.req_id in held] if step is not None else []
    out: dict[str, list[Any]] = {"runner.added.req_ids": ids, "runner.added.prompt_len": [],
                                 "runner.added.prefill_len": [], "runner.added.num_computed": [],
                                 "runner.added.token_ids": [], "runner.added.num_blocks": []}
    for req_id in ids:
        idx = held[req_id]
        prefill_len = int(states.prefill_len.np[idx])
        out["runner.added.prompt_len"].append(int(states.prompt_len.np[idx]))
        out["runner.added.prefill_len"].append(prefill_len)
        out["runner.added.num_computed"].append(int(states.num_computed_tokens_np[idx]))
        out["runner.added.token_ids"].append(states.all_token_ids.gpu[idx, :prefill_len].cpu().tolist())
        out["runner.added.num_blocks"].append([int(n) for n in tables.num_blocks.np[:, idx]])
    return out
