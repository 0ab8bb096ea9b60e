"""vLLM's dummy batches, each held to what it is for (rules cited from vLLM's comments).

execute_model builds placeholder rows on three paths (the profile run, the idle DP dummy,
the capture dummy); each has a purpose, and the purpose decides the values the forward
must receive: ``check_profile``, ``check_idle_dummy`` and ``check_capture_padding``, with
the paths tabled in ``check_profile``'s docstring (``evidence.RULES`` holds each cited line).
Fields of features the rig never enables hold their off value (``check_placeholder_fields``).
See docs/cudagraph.md and docs/oracle.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.ledger.evidence import RULES
from simrig.observe import CAPTURE, DUMMY, PROFILE, StageObs
from simrig.reference.blocks import dcp_local_seq_len
from simrig.reference.semantics import field_value
from simrig.step import RunnerConfig

CHECK = "dummy_batches"
FEATURES_OFF: dict[str, object] = {"prompt_lens": None, "max_seq_len_np": None, "fast_prefill": None,
                                   "num_admitted_draft_tokens": None, "has_structured_output_reqs": False}


def _finding(index: int, stage: StageObs, name: str, expected: Any, actual: Any, why: str) -> Finding:
    return Finding(kind=fk.VALUE_MISMATCH, step=index, stage=stage.stage, check=CHECK, rank=stage.rank,
                   field=name, expected=str(expected), actual=str(actual), message=why)


def _scalar(stage: StageObs, name: str) -> int | None:
    value = field_value(stage, name)
    return None if value is None else int(value)


def _padding(index: int, stage: StageObs, want: bool, rule: str) -> list[Finding]:
    """is_padding is ``want`` at every position (either PCP shape: the same mask on each rank)."""
    mask = field_value(stage, "is_padding")
    if mask is None:
        return []
    mask = np.asarray(mask).astype(bool)
    wrong = np.flatnonzero(mask != want)
    if not wrong.size:
        return []
    cite = RULES[rule]
    # every position wrong reads "all <value>": a known finding can name that form exactly
    actual = f"all {not want}" if wrong.size == mask.size else \
        f"{wrong.size} of {mask.size} {not want} (first at {int(wrong[0])})"
    return [_finding(index, stage, "is_padding", f"all {want}", actual,
                     f"{'every token of the profile run is real' if not want else 'every dummy token is padding'}"
                     f" ({cite.where()})")]


@guarded(CHECK)
def check_profile(index: int, config: RunnerConfig, stage: StageObs) -> list[Finding]:
    """The profile run's batch: every token real, the whole token budget, an even split.

    execute_model builds a batch of placeholder rows on three paths; each has a purpose, and
    the purpose decides the values the forward must receive (``evidence.RULES`` holds each
    cited line; tests/test_evidence.py re-reads them):

        path            what it is for                          what follows
        ────            ──────────────                          ────────────
        profile run     measure peak memory at the largest      every token real (is_padding all
                        step: "Profiling and warmup must route   False, in either PCP shape); the
                        the dummy tokens to experts so MoE       whole token budget ("compiles the
                        memory is measured"; "a profile run      model for max_num_batched_tokens";
                        which compiles the model for             below it only when drafts' extra
                        max_num_batched_tokens"                  slots "would exceed the token
                                                                 budget"); 1..max_num_reqs requests,
                                                                 none longer than ceil(tokens/reqs)
                                                                 ("Distribute the remainder evenly"),
                                                                 nor max_model_len when the budget
                                                                 fits max_num_reqs requests (vLLM
                                                                 warns otherwise)
        idle (DP) dummy "No actual tokens to run. A dummy run    every token padding; the batch has
                        for DP": an idle rank runs the shape     its descriptor's tokens (and
                        its peers run                            requests, when set), the descriptor
                                                                 holds the step's tokens, a promised
                                                                 max query length is carried
        capture dummy   "Capture with dummy rows marked as       every token padding
                        padding."

    Under PCP the mask may be the MoE-gathered one ("Expand a capture/dummy padding mask,
    identical on every PCP rank, to the rows the MoE routes"): the same value at every
    position, so the rule reads every position. A dummy's DCP local lengths are each DCP
    rank's share of its own seq_lens (blocks.py's rule, "token i is stored on dcp_rank
    i % dcp_world_size"). One meaning for every release: a release that marks profile
    tokens as padding (0.30.0 has no such argument) is judged by it.

    Fields of features the rig never enables hold their documented off value on every batch
    (``check_placeholder_fields``): ``prompt_lens`` "only populated for R-SWA", ``max_seq_len_np``
    "only populated for non-dummy pipeline-parallel batches", ``fast_prefill`` arms "the
    KV-sharing fast prefill path", ``num_admitted_draft_tokens`` "Set only under adaptive
    verification" (all None), ``has_structured_output_reqs`` False (no trace sends grammar).
    A placeholder batch's ``cu_num_logits_np`` is its ``cu_num_logits`` (both ``[num_reqs + 1]``).
    """
    if stage.stage != PROFILE or stage.error is not None or not stage.fields:
        return []
    out = _padding(index, stage, False, "profile_real")
    tokens, reqs = _scalar(stage, "num_tokens"), _scalar(stage, "num_reqs")
    budget = config.max_num_batched_tokens
    if tokens is not None:
        drafts = config.num_speculative_tokens > 0
        if tokens > budget or (not drafts and tokens != budget):
            out.append(_finding(index, stage, "num_tokens", budget if not drafts else f"<= {budget}", tokens,
                                f"the profile run measures the whole token budget ({RULES['profile_budget'].where()}"
                                f"; below it only for drafts: {RULES['profile_drafts'].where()})"))
    if reqs is not None and not 1 <= reqs <= config.max_num_reqs:
        out.append(_finding(index, stage, "num_reqs", f"1..{config.max_num_reqs}", reqs,
                            "the profile run's requests fit the batch (max_num_reqs)"))
    queries = field_value(stage, "num_scheduled_tokens")
    if queries is not None and tokens and reqs:
        longest = int(np.asarray(queries)[:reqs].max())
        bound = min(math.ceil(tokens / reqs), config.max_model_len)
        if longest > bound:
            finding = _finding(index, stage, "num_scheduled_tokens", f"<= {bound}", longest,
                               f"no profile request exceeds ceil(tokens / requests) nor max_model_len "
                               f"({RULES['even_split'].where()})")
            if longest <= math.ceil(tokens / reqs):
                # split evenly, but the even share itself is over max_model_len: a token budget
                # over max_num_reqs * max_model_len, which vLLM's SchedulerConfig only warns about
                # (evidence.RULES['budget_fits']): a known finding, out of scope
                finding.extra["pattern"] = "even_share_over_max_model_len"
            out.append(finding)
    return out


@guarded(CHECK)
def check_idle_dummy(index: int, requested: int, stage: StageObs) -> list[Finding]:
    """The idle (DP) dummy run after a step of ``requested`` tokens: no real token, the
    shape its descriptor describes, a descriptor that holds the step."""
    if stage.stage != DUMMY or stage.error is not None or not stage.fields:
        return []
    out = _padding(index, stage, True, "idle_no_tokens")
    desc_tokens, desc_reqs = _scalar(stage, "desc.num_tokens"), _scalar(stage, "desc.num_reqs")
    tokens = _scalar(stage, "num_tokens_after_padding")
    shape = RULES["descriptor"].where()
    if desc_tokens is not None and desc_tokens < requested:
        out.append(_finding(index, stage, "desc.num_tokens", f">= {requested}", desc_tokens,
                            f"the idle dummy's descriptor does not hold the step's tokens ({shape})"))
    if desc_tokens is not None and tokens is not None and tokens != desc_tokens:
        out.append(_finding(index, stage, "desc.num_tokens", tokens, desc_tokens,
                            f"the idle dummy runs another token count than its descriptor ({shape})"))
    reqs = _scalar(stage, "num_reqs_after_padding")
    if desc_reqs is not None and reqs is not None and reqs != desc_reqs:
        out.append(_finding(index, stage, "desc.num_reqs", reqs, desc_reqs,
                            f"the idle dummy runs another request count than its descriptor ({shape})"))
    promised, carried = _scalar(stage, "desc.max_query_len"), _scalar(stage, "max_query_len")
    if promised is not None and (carried is None or carried < promised):
        out.append(_finding(index, stage, "max_query_len", f">= {promised}", carried,
                            f"the descriptor's promised query length is not carried "
                            f"({RULES['promised_query'].where()})"))
    return out


@guarded(CHECK)
def check_capture_padding(index: int, stage: StageObs) -> list[Finding]:
    if stage.stage != CAPTURE or stage.error is not None or not stage.fields:
        return []
    return _padding(index, stage, True, "capture_padding")


@guarded(CHECK)
def check_dummy_moe_rows(index: int, config: RunnerConfig, stage: StageObs) -> list[Finding]:
    """Under PCP the MoE routes every rank's rows (RULES['moe_gathers']), so a dummy's mask
    covers P x its tokens (RULES['moe_mask']); one over its own tokens leaves the other
    ranks' rows unmarked (pattern ``moe_rows_not_gathered``, as partition/pcp.py)."""
    mask, tokens = field_value(stage, "is_padding"), _scalar(stage, "num_tokens_after_padding")
    if config.pcp_size <= 1 or stage.error is not None or mask is None or tokens is None:
        return []
    if np.asarray(mask).size == config.pcp_size * tokens:
        return []
    finding = _finding(index, stage, "is_padding", f"{config.pcp_size * tokens} rows", f"{np.asarray(mask).size} rows",
                       f"the MoE routes the {config.pcp_size} x {tokens} PCP-gathered rows "
                       f"({RULES['moe_gathers'].where()}), the dummy's mask covers {np.asarray(mask).size}")
    finding.extra["pattern"] = "moe_rows_not_gathered"
    return [finding]


@guarded(CHECK)
def check_capture_dcp_context(index: int, config: RunnerConfig, stage: StageObs) -> list[Finding]:
    """Under DCP a FULL graph is captured "with KV context so a host-side skip of DCP
    context attention is not baked into the graph" (RULES['dcp_capture_context']): every
    dummy row holds context on every DCP rank, at least dcp_size tokens (interleave 1).
    One meaning for every release: a release that captures on zero context is judged by it
    (pattern ``zero_dcp_context``)."""
    if config.dcp_size <= 1 or stage.error is not None or field_value(stage, "desc.cg_mode") != "FULL":
        return []
    qsl, seq_lens, reqs = field_value(stage, "query_start_loc_np"), field_value(stage, "seq_lens"), \
        _scalar(stage, "num_reqs")
    if qsl is None or seq_lens is None or not reqs:
        return []
    queries = np.diff(np.asarray(qsl)[:reqs + 1])
    context = (np.asarray(seq_lens)[:reqs].astype(np.int64) - queries)
    # no sequence outgrows max_model_len: a graph promising queries of max_query_len tokens
    # replays at most max_model_len - max_query_len tokens of context (set_dummy_context
    # clamps to it: "min(context_len, max_model_len - query_len)")
    promised = _scalar(stage, "max_query_len") or int(queries.max())
    need = min(config.dcp_size, max(0, config.max_model_len - promised))
    if (context >= need).all():
        return []
    finding = _finding(index, stage, "seq_lens", f"context >= {need} on every row",
                       f"context {context.tolist()}",
                       f"a FULL graph captured under DCP {config.dcp_size} without KV context on every "
                       f"DCP rank ({RULES['dcp_capture_context'].where()})")
    finding.extra["pattern"] = "zero_dcp_context" if not context.any() else "short_dcp_context"
    return [finding]


@guarded(CHECK)
def check_dummy_dcp(index: int, config: RunnerConfig, stage: StageObs) -> list[Finding]:
    """A dummy's DCP local lengths: DCP rank 0's share of each of its own seq_lens (0 past
    its rows); None without DCP."""
    local, seq_lens = field_value(stage, "dcp_local_seq_lens"), field_value(stage, "seq_lens")
    if stage.error is not None or local is None or seq_lens is None:
        return []
    if config.dcp_size <= 1:
        return [_finding(index, stage, "dcp_local_seq_lens", None, "set", "DCP local lengths without DCP")]
    rows = len(seq_lens)
    want = [dcp_local_seq_len(int(s), config.dcp_size, stage.dcp_rank) for s in seq_lens]
    got = np.asarray(local).astype(np.int64)
    if list(got[:rows]) != want or got[rows:].any():
        return [_finding(index, stage, "dcp_local_seq_lens", want, got.tolist(),
                         "DCP LOCAL SEQ LENS: tokens of each dummy sequence stored on this DCP rank")]
    return []


@guarded(CHECK)
def check_placeholder_fields(index: int, stage: StageObs, pp: bool = False) -> list[Finding]:
    """Features never enabled hold their off value; a placeholder batch's host
    cu_num_logits is its device one. With ``pp`` (pp_size > 1) a real batch's
    max_seq_len_np is PP's (checks/pp_ranks.py judges it)."""
    if stage.error is not None or not stage.fields:
        return []
    out = []
    for name, off in FEATURES_OFF.items():
        f = stage.fields.get(name)
        if f is None:
            continue  # not in this release's type
        if pp and name == "max_seq_len_np" and stage.stage not in (DUMMY, CAPTURE, PROFILE):
            continue
        value = None if f.kind == "none" else f.values
        if (off is None and value is not None) or (off is not None and value != off):
            out.append(_finding(index, stage, name, off, value if f.kind == "scalar" else f.kind,
                                f"{name} is set though its feature is never enabled"))
    if stage.stage in (DUMMY, CAPTURE, PROFILE):
        host, device = field_value(stage, "cu_num_logits_np"), field_value(stage, "cu_num_logits")
        if host is not None and device is not None and not np.array_equal(host, device):
            out.append(_finding(index, stage, "cu_num_logits_np", np.asarray(device).tolist(),
                                np.asarray(host).tolist(), "cu_num_logits_np differs from cu_num_logits"))
    return out
