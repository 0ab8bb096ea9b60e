"""An independent reference model of the MRV2 input path, built from the Steps alone.

``ReferenceModel`` follows each request's lifecycle and predicts, from semantics and
never from vLLM's code, what ``gather_batch_req_state`` and ``prepare_inputs`` must
produce (``BatchPrediction``); ``batch_order`` and ``order_problem`` hold the batch
order to vLLM's documented ordering rules. Slot numbers are learnt, then held to
their meaning.

See docs/oracle.md, 'The reference model' for the predictions and the order rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from simrig.findings import findings as fk
from simrig.reference.descriptor import descriptor, padded_counts
from simrig.reference.comparer import Comparer, short
from simrig.findings.findings import Finding, guarded
from simrig.observe import GATHER, PREPARE, StageObs, StepObs, handed_to_scheduler
from simrig.sampling.drafts import spread_drafts
from simrig.sampling.logits import drafting, spreads
from simrig.sampling.params import SamplingSpec
from simrig.step import SYNTH_VOCAB_SIZE, RunnerConfig, Step, draft_token, rejected_from, synth_token

@dataclass
class RequestModel:
    prefill_ids: list[int]  # [prefill_len] tokens handed to the runner
    num_computed: int
    slot: int | None = None  # learnt from the first observation
    # Rows spread by its sampling parameters (simrig.sampling.logits): its outputs are the
    # sampler's, learnt from what the runner handed the scheduler (position -> token)
    spread: bool = False
    given: dict[int, int] = field(default_factory=dict)
    spec: SamplingSpec | None = None  # a spread request's SamplingSpec: under drafts, its drafts follow its rows
    prompt_len: int = 0


@dataclass
class BatchPrediction:
    req_ids: list[str]  # batch order
    num_scheduled: np.ndarray  # [num_reqs]
    num_drafts: np.ndarray  # [num_reqs]
    num_computed: np.ndarray  # [num_reqs]
    prefill_len: np.ndarray  # [num_reqs]
    query_start_loc: np.ndarray  # [num_reqs + 1]
    seq_lens: np.ndarray  # [num_reqs]
    positions: np.ndarray  # [num_tokens]
    input_ids: np.ndarray  # [num_tokens]
    cu_num_logits: np.ndarray  # [num_reqs + 1]
    logits_indices: np.ndarray  # [total_num_logits]
    token_req: list[str] = field(default_factory=list)  # [num_tokens] owner of each token
    spread: frozenset[str] = frozenset()  # requests whose sampled tokens are the sampler's

    @property
    def is_prefilling(self) -> np.ndarray:
        return self.num_computed < self.prefill_len


class GlobalBatch(NamedTuple):
    """The model's global batch, as the PCP check needs it (row order = batch order)."""

    req_ids: list[str]
    query_lens: np.ndarray  # [num_reqs]
    is_prefilling: np.ndarray  # [num_reqs]
    query_start_loc: np.ndarray  # [num_reqs + 1]
    positions: np.ndarray  # [num_tokens]
    input_ids: np.ndarray  # [num_tokens]
    slots: np.ndarray  # [num_reqs] the model's slot of each row
    num_computed: np.ndarray  # [num_reqs]


def batch_order(scheduled: dict[str, int], drafts: dict[str, int], decode_query_len: int) -> list[str]:
    """The batch order the runner must use (the order rules in docs/oracle.md,
    'The reference model')."""
    def bucket(ids: list[str]) -> list[str]:
        exact = [r for r in ids if scheduled[r] == decode_query_len]
        others: dict[int, list[str]] = {}
        for r in ids:
            if scheduled[r] != decode_query_len:
                others.setdefault(scheduled[r], []).append(r)
        return exact + [r for n in sorted(others) for r in others[n]]

    ids = list(scheduled)
    with_drafts = [r for r in ids if drafts.get(r, 0) > 0]
    without = [r for r in ids if drafts.get(r, 0) <= 0]
    return bucket(with_drafts) + bucket(without)


def order_problem(order: list[str], scheduled: dict[str, int], drafts: dict[str, int],
                  decode_query_len: int) -> str:
    """Why ``order`` breaks the ORDER RULES (docs/oracle.md, 'The reference model'), or ""
    when it meets them."""
    if len(order) != len(scheduled) or set(order) != set(scheduled):
        return "the batch is not the scheduled requests, each once"
    verifying = [drafts.get(r, 0) > 0 for r in order]
    if any(not a and b for a, b in zip(verifying, verifying[1:])):
        return "a request without drafts precedes one with drafts (rule 1)"
    for group in (True, False):
        queries = [scheduled[r] for r, v in zip(order, verifying) if v == group]
        ranks = [(q != decode_query_len, q) for q in queries]
        if ranks != sorted(ranks):
            return ("query lengths out of order: decodes first, then non-decreasing "
                    f"lengths (rule 2), got {queries}")
    return ""


class ReferenceModel:
    def __init__(self, config: RunnerConfig):
        self.config = config
        self.reqs: dict[str, RequestModel] = {}

    # ------------------------------------------------------------ lifecycle
    def apply_lifecycle(self, step: Step) -> None:
        """finish/preempt, then add, then the scheduler's cached num_computed."""
        for req_id in (*step.finished, *step.preempted):
            self.reqs.pop(req_id, None)
        for req in step.new_requests:
            self.reqs[req.req_id] = RequestModel(req.prefill_token_ids(), req.num_computed_tokens,
                                                 spread=spreads(req.sampling, drafting(self.config),
                                                                req.structured_output),
                                                 spec=req.sampling, prompt_len=req.prompt_len)
        for upd in step.cached:
            if upd.req_id in self.reqs:
                self.reqs[upd.req_id].num_computed = upd.num_computed_tokens

    def advance(self, step: Step, obs: StepObs | None = None) -> None:
        """After the step: accepted tokens become computed (drafts may be rejected); a
        spread request's sampled token is learnt from the runner's output to the scheduler."""
        given = handed_to_scheduler(obs) if obs is not None else {}
        for req_id in step.num_scheduled_tokens:
            req = self.reqs.get(req_id)
            if req is not None:
                if req.spread:  # the tokens sampled after its last position before the drafts
                    first = req.num_computed + step.num_scheduled_tokens[req_id] - step.spec_tokens.get(req_id, 0)
                    req.given.update((first + j, int(t)) for j, t in enumerate(given.get(req_id, ())))
                req.num_computed += step.num_accepted(req_id)

    # ----------------------------------------------------------- prediction
    def predict(self, step: Step, order: list[str] | None = None) -> BatchPrediction | None:
        """Every field, row by row in ``order`` (default: one valid order)."""
        if not step.num_scheduled_tokens or any(r not in self.reqs for r in step.num_scheduled_tokens):
            return None
        if order is None or sorted(order) != sorted(step.num_scheduled_tokens):
            order = batch_order(step.num_scheduled_tokens, step.spec_tokens,
                                self.config.decode_query_len)
        q = np.array([step.num_scheduled_tokens[r] for r in order], dtype=np.int64)
        k = np.array([step.spec_tokens.get(r, 0) for r in order], dtype=np.int64)
        nc = np.array([self.reqs[r].num_computed for r in order], dtype=np.int64)
        plen = np.array([len(self.reqs[r].prefill_ids) for r in order], dtype=np.int64)
        qsl = np.concatenate([[0], np.cumsum(q)])
        positions, input_ids, token_req, logits = [], [], [], []
        for i, req_id in enumerate(order):
            ids = self.reqs[req_id].prefill_ids
            first_draft, first_rejected = int(nc[i] + q[i] - k[i]), rejected_from(step, req_id)
            spread = self._spread_drafts(req_id, first_draft, int(k[i]), first_rejected, step.grammar.get(req_id))
            for p in range(int(nc[i]), int(nc[i] + q[i])):
                positions.append(p)
                if p >= first_draft:
                    input_ids.append(spread[p - first_draft] if spread else
                                     draft_token(req_id, p, p - first_draft >= first_rejected))
                else:
                    input_ids.append(ids[p] if p < len(ids) else
                                     self.reqs[req_id].given.get(p, synth_token(req_id, p)))
                token_req.append(req_id)
            logits.extend(range(int(qsl[i + 1] - 1 - k[i]), int(qsl[i + 1])))
        return BatchPrediction(
            req_ids=order, num_scheduled=q, num_drafts=k, num_computed=nc, prefill_len=plen,
            query_start_loc=qsl, seq_lens=nc + q, positions=np.array(positions, dtype=np.int64),
            input_ids=np.array(input_ids, dtype=np.int64),
            cu_num_logits=np.concatenate([[0], np.cumsum(1 + k)]),
            logits_indices=np.array(logits, dtype=np.int64), token_req=token_req,
            spread=frozenset(r for r in order if self.reqs[r].spread))

    def _spread_drafts(self, req_id: str, first: int, k: int, first_rejected: int,
                       allowed: tuple[int, ...] | None) -> list[int]:
        """A spread request's drafts (simrig.sampling.drafts): from its prompt, the tokens it
        was given up to ``first`` and the step's grammar for it; [] for any other request (the
        token rule's drafts)."""
        req = self.reqs[req_id]
        if not k or not req.spread:
            return []
        ids = [*req.prefill_ids, *(req.given.get(p, synth_token(req_id, p))
                                   for p in range(len(req.prefill_ids), first))]
        return spread_drafts(req_id, req.spec, ids[: req.prompt_len], ids[req.prompt_len: first], first, k,
                             first_rejected, SYNTH_VOCAB_SIZE, allowed)

    # ----------------------------------------------------------- comparison
    def global_batch(self, step: Step, order: list[str] | None) -> GlobalBatch | None:
        """The prediction plus the slots learnt so far (None if a slot is unknown)."""
        pred = self.predict(step, order)
        if pred is None or any(self.reqs[r].slot is None for r in pred.req_ids):
            return None
        return GlobalBatch(pred.req_ids, pred.num_scheduled, pred.is_prefilling,
                           pred.query_start_loc, pred.positions, pred.input_ids,
                           np.array([self.reqs[r].slot for r in pred.req_ids], dtype=np.int64),
                           pred.num_computed)

    def observed_order(self, obs: StepObs) -> list[str] | None:
        """The batch order the runner chose (gather's, else prepare's)."""
        for name in (GATHER, PREPARE):
            stage = obs.get(name)
            f = stage.fields.get("req_ids") if stage is not None and stage.error is None else None
            if f is not None and f.kind == "list":
                return [str(r) for r in f.values]
        return None

    @guarded("reference")
    def compare(self, index: int, step: Step, obs: StepObs,
                skip: frozenset[str] = frozenset()) -> list[Finding]:
        """Findings for every field that disagrees with the prediction; rows of
        the requests in ``skip`` (those a contract violation left undefined)
        are not judged, every other row is."""
        order = self.observed_order(obs)
        pred = self.predict(step, order)
        if pred is None:
            return []
        out: list[Finding] = []
        gather, prepare = obs.get(GATHER), obs.get(PREPARE)
        if order is not None:
            problem = order_problem(order, step.num_scheduled_tokens, step.spec_tokens,
                                    self.config.decode_query_len)
            if problem:
                stage = gather if gather is not None and gather.error is None else prepare
                out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=stage.stage,
                                   check="reference", req_ids=tuple(order), field="req_ids",
                                   expected="an order meeting the batch-order rules",
                                   actual=short(order), message=f"batch order: {problem}"))
        out.extend(self._check_slots(index, pred, gather, prepare))
        row_ids, tok_ids = pred.req_ids, pred.token_req
        has_drafts = bool(pred.num_drafts.any())
        if gather is not None and gather.error is None and gather.fields:
            cmp = Comparer(index, gather, out, skip)
            cmp.array("num_scheduled_tokens", pred.num_scheduled, row_ids)
            cmp.array("prefill_len_np", pred.prefill_len, row_ids)
            cmp.array("num_computed_prefill_tokens_np", np.minimum(pred.num_computed, pred.prefill_len), row_ids)
            cmp.array("is_prefilling_np", pred.is_prefilling, row_ids)
            cmp.scalar("has_prefill", bool(pred.is_prefilling.any()))
            if has_drafts:
                cmp.array("num_draft_tokens_np", pred.num_drafts, row_ids)
        if prepare is not None and prepare.error is None and prepare.fields:
            num_tokens, num_reqs = int(pred.num_scheduled.sum()), len(row_ids)
            t_pad, r_pad = padded_counts(descriptor(obs), num_tokens, num_reqs)
            req_pad = np.zeros(r_pad - num_reqs, dtype=np.int64)  # padded requests: no tokens
            pad_ids = row_ids + ["<padding>"] * (r_pad - num_reqs)
            cmp = Comparer(index, prepare, out, skip)
            cmp.list_("req_ids", pred.req_ids)  # the same order as gather's
            cmp.scalar("num_tokens", num_tokens)
            cmp.scalar("num_tokens_after_padding", t_pad)
            cmp.scalar("num_reqs_after_padding", r_pad)
            cmp.array("num_scheduled_tokens", pred.num_scheduled, row_ids)
            qsl = np.concatenate([pred.query_start_loc, req_pad + num_tokens])
            cmp.array("query_start_loc", qsl, pad_ids)
            cmp.array("query_start_loc_np", qsl, pad_ids)
            cmp.array("seq_lens", np.concatenate([pred.seq_lens, req_pad]), pad_ids)
            cmp.array("seq_lens_cpu_upper_bound", np.concatenate([pred.seq_lens, req_pad]), pad_ids)
            cmp.array("num_computed_tokens_np", pred.num_computed, row_ids)
            cmp.array("is_prefilling_np", pred.is_prefilling, row_ids)
            cmp.array("positions", pred.positions, tok_ids, padded_to=t_pad,
                      tail_range=(0, self.config.max_model_len))
            cmp.array("input_ids", pred.input_ids, tok_ids, padded_to=t_pad, tail_range=(0, SYNTH_VOCAB_SIZE))
            cmp.array("is_padding", np.zeros(len(tok_ids), dtype=bool), tok_ids, padded_to=t_pad)
            cmp.array("cu_num_logits", pred.cu_num_logits, row_ids)
            cmp.array("cu_num_logits_np", pred.cu_num_logits, row_ids)
            logit_ids = [r for r, n in zip(row_ids, 1 + pred.num_drafts) for _ in range(n)]
            cmp.array("logits_indices", pred.logits_indices, logit_ids)
            slots = [self.reqs[r].slot for r in row_ids]
            if all(slot is not None for slot in slots):
                cmp.array("expanded_idx_mapping", np.repeat(np.array(slots, dtype=np.int64),
                                                            1 + pred.num_drafts), logit_ids)
            longest = int(pred.num_scheduled.max())
            limit = prepare.fields.get("max_query_len")
            if limit is not None and limit.kind == "scalar" and int(limit.values) < longest:
                cmp._add("max_query_len", (), f">= {longest}", limit.values,
                         "max_query_len promises less than the batch's longest query")
        return out

    def _check_slots(self, index: int, pred: BatchPrediction, gather: StageObs | None,
                     prepare: StageObs | None) -> list[Finding]:
        """idx_mapping: distinct in-range slots, equal across stages, stable per request."""
        out: list[Finding] = []
        views = [(s, name) for s, name in ((gather, "idx_mapping_np"), (prepare, "idx_mapping_np"),
                                            (prepare, "idx_mapping"))
                 if s is not None and s.error is None and name in s.fields and s.fields[name].kind != "none"]
        if not views:
            return out
        first_stage, first_name = views[0]
        slots = np.asarray(first_stage.fields[first_name].values).astype(np.int64)

        def finding(stage: StageObs, name: str, ids: tuple[str, ...], exp: str, act: str, msg: str) -> None:
            out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=stage.stage, check="reference",
                               req_ids=ids, field=name, expected=exp, actual=act, message=msg))

        for stage, name in views[1:]:
            other = np.asarray(stage.fields[name].values).astype(np.int64)
            if other.shape != slots.shape or not np.array_equal(other, slots):
                finding(stage, name, tuple(pred.req_ids), short(slots), short(other),
                        f"differs from {first_stage.stage}.{first_name}")
        if len(slots) != len(pred.req_ids):
            return out  # the row count itself is reported by compare()
        if len(set(slots.tolist())) != len(slots):
            dup = [r for r, s in zip(pred.req_ids, slots) if (slots == s).sum() > 1]
            finding(first_stage, first_name, tuple(dup), "distinct slots", short(slots),
                    "two requests of the batch share a slot")
        bad = [r for r, s in zip(pred.req_ids, slots) if not 0 <= s < self.config.max_num_reqs]
        if bad:
            finding(first_stage, first_name, tuple(bad), f"slots in [0, {self.config.max_num_reqs})",
                    short(slots), "slot out of range")
        owner = {m.slot: r for r, m in self.reqs.items() if m.slot is not None}
        for req_id, slot in zip(pred.req_ids, slots.tolist()):
            model = self.reqs[req_id]
            if model.slot is not None and model.slot != slot:
                finding(first_stage, first_name, (req_id,), f"slot {model.slot}", f"slot {slot}",
                        f"request {req_id} moved slots while live")
            elif model.slot is None and owner.get(slot, req_id) != req_id:
                finding(first_stage, first_name, (req_id, owner[slot]), "a free slot", f"slot {slot}",
                        f"slot {slot} already held by live request {owner[slot]}")
            model.slot = slot
        return out
