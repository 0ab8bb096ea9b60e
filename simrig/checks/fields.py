"""Value expectations for the fields the reference model leaves out, each from its documented meaning.

``check_model_fields`` holds fields vLLM documents but the reference model does not
predict (``prefill_runs_as_decode_np``, ``decode_graph_eligible``, draft counts, the
sampled and rejected counts) to the same prediction; ``check_runner_state`` holds the
runner's live requests and free slots to the scheduler's.

See docs/oracle.md, 'Fields beyond the reference model' for each field and its source.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import GATHER, POSTPROCESS, PREPARE, StepObs
from simrig.reference.comparer import Comparer
from simrig.step import RunnerConfig, Step, synth_token


def runs_as_decode(is_prefilling: np.ndarray, num_scheduled: np.ndarray, num_drafts: np.ndarray,
                   num_computed: np.ndarray) -> np.ndarray:
    """Rows that are prefilling and schedule one new prompt token over existing context."""
    return is_prefilling & (num_scheduled - num_drafts == 1) & (num_computed > 0)


def decode_graph_eligible(is_prefilling: np.ndarray, as_decode: np.ndarray | None) -> bool:
    """No prefill row, or only prefill rows that run as decodes (``as_decode`` None: none do)."""
    rows = is_prefilling if as_decode is None else is_prefilling & ~as_decode
    return not bool(rows.any())


@guarded("fields")
def check_model_fields(index: int, config: RunnerConfig, step: Step, obs: StepObs, pred: Any,
                       skip: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for the fields of docs/oracle.md's 'Fields beyond the reference model',
    against the model's ``pred``."""
    out: list[Finding] = []
    if pred is None:
        return out
    rows = pred.req_ids
    prefilling = pred.is_prefilling
    pcp = config.pcp_size > 1
    as_decode = None if pcp else runs_as_decode(prefilling, pred.num_scheduled, pred.num_drafts,
                                                pred.num_computed)
    eligible = decode_graph_eligible(prefilling, as_decode)
    for name in (GATHER, PREPARE):
        stage = obs.get(name)
        if stage is None or stage.error is not None or not stage.fields:
            continue
        cmp = Comparer(index, stage, out, skip)
        if as_decode is not None and prefilling.any():
            cmp.array("prefill_runs_as_decode_np", as_decode, rows)
        if "decode_graph_eligible" in stage.fields:  # 0.30.0 has no such field
            cmp.scalar("decode_graph_eligible", eligible)
        if name == GATHER:
            cmp.scalar("num_tokens", int(pred.num_scheduled.sum()))
        else:
            if pred.num_drafts.any():
                cmp.array("num_draft_tokens_per_req", pred.num_drafts, rows)
            cmp.scalar("num_draft_tokens", int(pred.num_drafts.sum()))
            cmp.array("prefill_len_np", pred.prefill_len, rows)
            cmp.array("num_computed_prefill_tokens_np", np.minimum(pred.num_computed, pred.prefill_len), rows)
            meta = stage.fields.get("pcp")
            if meta is not None and meta.kind != "none":  # "Set only on a PCP rank-local batch."
                cmp._add("pcp", (), None, meta.kind, "the global batch carries PCP rank-local metadata")
    out.extend(_pcp_metadata(index, step, obs, pred, skip))
    post = obs.get(POSTPROCESS)
    if post is not None and post.error is None and post.fields:
        chunked = pred.num_computed + pred.num_scheduled < pred.prefill_len
        rejected = np.array([step.rejected.get(r, 0) for r in rows], dtype=np.int64)
        sampled = np.where(chunked, 0, 1 + pred.num_drafts - rejected)
        cmp = Comparer(index, post, out, skip)
        n = len(rows)
        for field, want in (("num_sampled", sampled), ("num_rejected", np.where(chunked, 0, rejected))):
            f = post.fields.get(field)
            if f is not None and f.kind in ("numpy", "torch"):
                got = np.asarray(f.values)[:n]
                if not np.array_equal(got.astype(np.int64), want.astype(np.int64)):
                    bad = [r for r, a, b in zip(rows, got, want) if a != b and r not in skip]
                    if bad:
                        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS,
                                           check="fields", req_ids=tuple(bad), field=field,
                                           expected=str(want.tolist()), actual=str(got.tolist()),
                                           message=f"{field} per row: a chunk that ends before the "
                                                   "prompt's end samples nothing; otherwise 1 + drafts "
                                                   "- rejected are sampled"))
        first = pred.num_computed + pred.num_scheduled - pred.num_drafts  # the first position sampled
        out.extend(_runner_output(index, post, rows, sampled, skip, first, pred.spread))
    for f in out:
        if f.check == "reference":
            f.check = "fields"
    return out


def _runner_output(index: int, post: Any, rows: list[str], sampled: np.ndarray, skip: frozenset[str],
                   first: np.ndarray | None = None, spread: frozenset[str] = frozenset()) -> list[Finding]:
    """What sample_tokens hands the scheduler (``ModelRunnerOutput``): one entry
    per request of the batch, in batch order ("req_ids" with "req_id_to_index"
    as its inverse), each holding exactly the tokens sampled for it: the
    trace's tokens at positions ``first``, ``first + 1``, ... (the stand-in
    logits name ``synth_token(r, p + 1)`` on the row ending at p)."""
    out: list[Finding] = []
    ids = post.fields.get("output.req_ids")
    if ids is not None and ids.kind == "list" and list(ids.values) != list(rows):
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="fields",
                           req_ids=tuple(r for r in rows if r not in skip), field="output.req_ids",
                           expected=str(list(rows)), actual=str(list(ids.values)),
                           message="the runner's output lists the batch's requests in batch order"))
        return out
    lens = post.fields.get("output.num_sampled_tokens")
    if lens is not None and lens.kind == "list":
        got = np.asarray(lens.values, dtype=np.int64)
        bad = [r for r, a, b in zip(rows, got, sampled) if a != b and r not in skip]
        if bad or len(got) != len(rows):
            out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="fields",
                               req_ids=tuple(bad), field="output.sampled_token_ids",
                               expected=str(sampled.tolist()), actual=str(got.tolist()),
                               message="tokens handed to the scheduler per request: exactly the "
                                       "ones sampled (1 + drafts - rejected; none for a chunk "
                                       "that ends before the prompt's end)"))
            return out
    tokens = post.fields.get("output.sampled_token_ids")
    if tokens is not None and tokens.kind == "list" and first is not None:
        bad = [r for i, r in enumerate(rows) if r not in skip | spread and list(tokens.values[i]) !=
               [synth_token(r, int(first[i]) + j) for j in range(int(sampled[i]))]]
        if bad:
            out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="fields",
                               req_ids=tuple(bad), field="output.sampled_token_ids",
                               expected="synth_token(req, p) at each sampled position p",
                               actual=str([list(tokens.values[rows.index(r)]) for r in bad]),
                               message="tokens handed to the scheduler are the trace's tokens at "
                                       "the positions sampled, in order"))
    return out


def _pcp_metadata(index: int, step: Step, obs: StepObs, pred: Any, skip: frozenset[str]) -> list[Finding]:
    """PCPBatchMetadata of each rank-local batch: ``global_num_tokens`` "Unpadded
    token count before PCP partitioning"; ``global_query_lens_np`` "[num_reqs],
    aligned with local request segments" (each local row: its request's global
    query length) and ``global_seq_lens_cpu_upper_bound_np`` likewise (at least
    the request's global seq_len). Rows that schedule nothing are placeholders."""
    out: list[Finding] = []
    glob_q = dict(zip(pred.req_ids, pred.num_scheduled.tolist()))
    glob_len = dict(zip(pred.req_ids, pred.seq_lens.tolist()))
    for part in obs.all("partition"):
        if part.error is not None or "pcp.global_num_tokens" not in part.fields:
            continue
        cmp = Comparer(index, part, out, skip)
        cmp.scalar("pcp.global_num_tokens", int(pred.num_scheduled.sum()))
        ids = part.fields.get("req_ids")
        local_q = part.fields.get("num_scheduled_tokens")
        if ids is None or local_q is None or ids.kind != "list":
            continue
        rows = [str(r) for r in ids.values]
        real = [i for i, n in enumerate(np.asarray(local_q.values)[: len(rows)]) if n > 0 and rows[i] in glob_q]
        for field, want, rule in (("pcp.global_query_lens_np", glob_q, "=="),
                                  ("pcp.global_seq_lens_cpu_upper_bound_np", glob_len, ">=")):
            f = part.fields.get(field)
            if f is None or f.kind not in ("numpy", "torch") or not real:
                continue
            got = np.asarray(f.values).astype(np.int64)
            bad = [rows[i] for i in real if i >= len(got) or not (
                got[i] == want[rows[i]] if rule == "==" else got[i] >= want[rows[i]])]
            bad = [r for r in bad if r not in skip]
            if bad:
                out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage="partition", check="fields",
                                   rank=part.rank, req_ids=tuple(dict.fromkeys(bad)), field=field,
                                   expected=f"{rule} the request's global value ({[want[r] for r in rows if r in want]})",
                                   actual=str(got.tolist()),
                                   message=f"{field} of a local row is not its request's global value"))
    return out


@guarded("runner_state")
def check_runner_state(index: int, config: RunnerConfig, obs: StepObs, live: set[str]) -> list[Finding]:
    """The runner's live set is the model's, and its free slots with the live
    requests' slots are every slot once (``RequestState``: ``req_id_to_index``
    holds the live requests, ``free_indices`` starts as ``range(max_num_reqs)``
    and a removed request's slot is appended back)."""
    stage = obs.get("lifecycle")
    if stage is None or stage.error is not None or "runner.live_ids" not in stage.fields:
        return []
    out: list[Finding] = []

    def add(field: str, expected: Any, actual: Any, ids: tuple[str, ...], msg: str) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage="lifecycle", check="runner_state",
                           req_ids=ids, field=field, expected=str(expected), actual=str(actual),
                           message=msg))

    held = [str(r) for r in stage.fields["runner.live_ids"].values]
    if set(held) != live:
        diff = tuple(sorted(set(held) ^ live))
        add("runner.live_ids", sorted(live), sorted(held), diff,
            "the runner holds a different set of requests than the scheduler left live")
    slots = [int(s) for s in stage.fields["runner.live_slots"].values]
    free = [int(s) for s in stage.fields["runner.free_slots"].values]
    every = sorted(slots + free)
    if every != list(range(config.max_num_reqs)):
        dup = sorted({s for s in every if every.count(s) > 1})
        add("runner.free_slots", f"live and free slots = each of 0..{config.max_num_reqs - 1} once",
            f"live {sorted(slots)}, free {sorted(free)}", tuple(held),
            "a slot is free twice, free while held, or lost" + (f" (twice: {dup})" if dup else ""))
    return out
