"""Dummy/real parity: ``InputBatch.make_dummy`` must build what prepare_inputs builds.

Cudagraph capture and profiling run on dummy batches, and a graph captured on a dummy field
of another dtype (or shape) than the real one is replayed with the wrong buffer. Each step's
dummy stage, built for the step's own descriptor, is compared with the real batch field by
field (the rules are tabled in ``check_parity``). See docs/oracle.md, 'The oracle: what every
replay checks' (the ``parity`` row).
"""

from __future__ import annotations

from typing import Any

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import DUMMY, StageObs
from simrig.reference.contract import ARRAY_KINDS, stage_req_ids

SHAPED_FIELDS = (
    "idx_mapping", "idx_mapping_np", "query_start_loc", "query_start_loc_np", "seq_lens",
    "seq_lens_cpu_upper_bound", "num_scheduled_tokens", "input_ids", "positions", "is_padding",
    "cu_num_logits", "cu_num_logits_np", "num_computed_tokens_np", "prefill_len_np",
    "num_computed_prefill_tokens_np", "is_prefilling_np",
)
SHAPED_UNLESS_DRAFTS = ("logits_indices", "expanded_idx_mapping", "expanded_local_pos")
TOKEN_SHAPED = ("input_ids", "positions", "is_padding")
# Observed beside a batch, not built with it: prepare_attn's block tables and
# slot mappings and execute_model's DCP lengths (reference/blocks.py), the PCP
# manager's own index arrays (simrig's view of the manager), and the PCP batch
# metadata only partition_batch builds: a dummy under PCP is staged by
# prepare_inputs_for_capture_or_profile, "Stage a capture or dummy batch in
# persistent PCP input buffers" (buffers only; partition/pcp.py judges the metadata).
NOT_BUILT_WITH_THE_BATCH = ("attn.", "manager.", "pcp.")
# dcp_local_seq_lens_cpu_upper_bound is that PCP metadata before 0.33 moved it into ``pcp``
NOT_BUILT_FIELDS = ("dcp_local_seq_lens", "dcp_local_seq_lens_cpu_upper_bound",
                    # host-only, "only populated for non-dummy pipeline-parallel batches"
                    # (InputBatch.max_seq_len_np; checks/pp_ranks.py judges its values)
                    "max_seq_len_np")
REQUEST_SHAPED = ("query_start_loc", "query_start_loc_np", "seq_lens", "seq_lens_cpu_upper_bound")


DESC_FIELDS = ("cg_mode", "num_tokens", "num_reqs", "uniform_token_count", "max_query_len")


def desc_key(fields: dict, prefix: str) -> tuple:
    """A descriptor's identity from observed ``prefix + name`` fields (FieldObs)
    or from a plain dict of values (prefix "")."""
    def value(name: str) -> Any:
        v = fields.get(prefix + name)
        return getattr(v, "values", v)
    return tuple(value(name) for name in DESC_FIELDS)


@guarded("parity")
def check_parity(index: int, real: StageObs, dummy: StageObs, desc: dict | None = None,
                 graph_batches: list[StageObs] | None = None,
                 captured: StageObs | None = None) -> list[Finding]:
    """``desc``: the step's descriptor as the dispatch stage observed it;
    ``graph_batches``: what the graph runs (PCP rank-local batches), default ``[real]``;
    ``dummy``: the dummy run of this step (its own descriptor in ``desc.*``);
    ``captured``: the capture dummy of the step's graph (graph steps).

    Cudagraph capture and profiling run on dummy batches; a graph captured on a
    dummy field of another dtype (or shape) than the real one is replayed with
    the wrong buffer. For each step the dummy stage is built for the step's own
    descriptor (eager: the real (num_reqs, num_tokens); a graph: the batch that
    graph was captured with), so both are comparable field by field:

        field                         dtype   shape
        every array in both           =       -
        eager step:
          SHAPED_FIELDS               =       =
          SHAPED_UNLESS_DRAFTS        =       = only when the step has no drafts
                                              (drafts add logits rows the dummy lacks)
        graph step (the graph reads these buffers at their captured shape;
        BatchExecutionDescriptor: "num_reqs None means no request padding"):
          TOKEN_SHAPED                        = for every graph mode
          REQUEST_SHAPED                      = for FULL graphs (requests padded too)
          compared on what the graph runs: the rank-local batches under PCP
        an array on one side, None    missing_field: a graph captured on the dummy
          or absent on the other      reads a buffer the real batch fills (or the
                                      reverse); never skipped
    """
    if real.error is not None or dummy.error is not None:
        return []
    drafts = real.fields.get("num_draft_tokens")
    has_drafts = drafts is not None and bool(drafts.values)
    graph = desc is not None and desc.get("cg_mode") not in (None, "NONE")
    same_desc = desc is not None and desc_key(desc, "") == desc_key(dummy.fields, "desc.")
    shaped: set[str] = set()
    if graph:
        padded = set(TOKEN_SHAPED) | (set(REQUEST_SHAPED) if desc.get("cg_mode") == "FULL" else set())
    elif same_desc:  # the dummy ran eagerly at the real batch's shape: field for field
        shaped = set(SHAPED_FIELDS) | (set() if has_drafts else set(SHAPED_UNLESS_DRAFTS))
    ids = stage_req_ids(real)
    out = []
    for name in list(real.fields) + [n for n in dummy.fields if n not in real.fields]:
        if name.startswith(NOT_BUILT_WITH_THE_BATCH) or name in NOT_BUILT_FIELDS:
            continue
        r, d = real.fields.get(name), dummy.fields.get(name)
        r_array = r is not None and r.kind in ARRAY_KINDS
        d_array = d is not None and d.kind in ARRAY_KINDS
        if r_array != d_array:
            if (r if r_array else d).kind in ARRAY_KINDS and _absent_or_none(d if r_array else r):
                present = r if r_array else d
                other = "missing" if (d if r_array else r) is None else "None"
                out.append(Finding(
                    kind=fk.MISSING_FIELD, step=index, stage=DUMMY, check="parity", req_ids=ids,
                    field=name, expected=f"{r.kind} {r.dtype}" if r_array else other,
                    actual=other if r_array else f"{d.kind} {d.dtype}",
                    message=(f"real batch has {present.kind} {present.dtype}, dummy batch {other}"
                             if r_array else
                             f"dummy batch has {present.kind} {present.dtype}, real batch {other}")))
            continue
        if not r_array:
            continue
        if (r.kind, r.dtype) != (d.kind, d.dtype):
            out.append(Finding(
                kind=fk.DTYPE_DRIFT, step=index, stage=DUMMY, check="parity", req_ids=ids,
                field=name, expected=f"{r.kind} {r.dtype}", actual=f"{d.kind} {d.dtype}",
                message=f"real batch has {r.kind} {r.dtype}, dummy batch {d.kind} {d.dtype}"))
        elif name in shaped and r.shape != d.shape:
            out.append(Finding(
                kind=fk.VALUE_MISMATCH, step=index, stage=DUMMY, check="parity", req_ids=ids,
                field=name, expected=f"shape {r.shape}", actual=f"shape {d.shape}",
                message=f"real batch shape {r.shape}, dummy batch shape {d.shape}"))
    graph_dummy = captured if captured is not None else (dummy if same_desc else None)
    if graph and graph_dummy is not None:
        dummy = graph_dummy
        for batch in graph_batches if graph_batches is not None else [real]:
            if batch.error is not None:
                continue
            for name in sorted(padded):
                r, d = batch.fields.get(name), dummy.fields.get(name)
                if r is None or d is None or r.kind not in ARRAY_KINDS or d.kind not in ARRAY_KINDS:
                    continue
                if r.shape != d.shape:
                    where = "" if batch.rank is None else f" (PCP rank {batch.rank})"
                    out.append(Finding(
                        kind=fk.VALUE_MISMATCH, step=index, stage=DUMMY, check="parity", req_ids=ids,
                        rank=batch.rank, field=name, expected=f"shape {d.shape}",
                        actual=f"shape {r.shape}",
                        message=f"{desc['cg_mode']} graph captured with {name} shape {d.shape}, "
                                f"replayed with {r.shape}{where}"))
    return out


def _absent_or_none(obs: object) -> bool:
    return obs is None or getattr(obs, "kind", None) == "none"
