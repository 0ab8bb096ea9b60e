"""The non-last pipeline-parallel rank, judged against the last rank and the trace.

The harness drives a non-last rank next to the last one (simrig/adapters/pp_peer.py) and
records its ``pipeline`` stage (rank 0). ``PipelineTracker`` holds it to vLLM's own words:
the same batch as the last rank, the drafts received, num_computed_tokens, the
need_sampled_mask and every broadcast received (tabled in its docstring, with the
scheduler's side of the contract). See docs/oracle.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.observe import LIFECYCLE, PIPELINE, PREPARE, StepObs
from simrig.step import RunnerConfig, Step

PP_DECODE_INTERVAL = "pp_decode_interval"  # the contract rule a too-early request breaks


@dataclass
class _Request:
    prompt_len: int
    max_tokens: int
    prefill_len: int
    sampled_at: int | None = None  # the last step at which it sampled
    drafts: list[int] | None = None  # what the last rank proposed (broadcast) at that step


class PipelineTracker:
    """Follows the trace's requests across steps for the PP rules above.

    Under PP every rank receives the same ``SchedulerOutput``; only the last rank
    samples and broadcasts what it sampled (``PPHandler``, vllm/v1/worker/gpu/pp_utils.py).
    The harness drives a non-last rank next to the last one (adapters/pp_peer.py)
    and records the ``pipeline`` stage (rank 0). What the non-last rank must do,
    from vLLM's own words:

        rule                                  vLLM's meaning
        ────                                  ──────────────
        same batch as the last rank           every rank runs the same scheduled batch; a decode's
          (req_ids, positions, seq_lens,      input is the token the last rank sampled: "update
          query_start_loc, input_ids)         decode requests with sampler output from the prior step
                                              in which they were scheduled (pp_size steps ago)"
                                              (GPUModelRunner.update_pp_decode_requests)
        drafts received                       a draft position holds the drafts the last rank
                                              proposed and broadcast in the request's sampling step:
                                              "Broadcast draft proposals so non-last ranks can embed
                                              real token ids" (PPHandler.broadcast_drafts)
        last rank's num_computed_tokens       computed + scheduled - rejected (postprocess_sampled)
        num_computed_tokens after the step    computed + scheduled: "Optimistically update
                                              num_computed_tokens for entire batch here. Will be
                                              adjusted for rejections if necessary"
                                              (GPUModelRunner.sample_tokens, non-last rank)
        need_sampled_mask                     "marking requests with outputs that might be needed in
                                              a subsequent (decode) step" (compute_need_sampled_mask):
                                              a row whose step ends short of its prefill samples
                                              nothing and is never marked; a row that samples and may
                                              run again (its length after the sample below
                                              min(prompt_len + max_tokens, max_model_len)) is always
                                              marked; a row whose sample ends the request may be either
        every broadcast received              what the last rank sends, the other ranks receive
                                              (a broadcast is collective): none is left over; a
                                              step with a row that must be marked broadcasts

    The scheduler's side of the contract: "V2+PP+async: enforce `pp_size` steps
    between same-req decodes to match worker-side sampled-tokens broadcast slot
    ring cadence" (Scheduler.schedule, ``next_decode_eligible_step``): a request
    that sampled at step k is scheduled again at step k + pp_size at the
    earliest; an earlier one is a contract violation of the input and its rows
    are not judged.
    """

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.reqs: dict[str, _Request] = {}

    def check(self, index: int, step: Step, obs: StepObs) -> list[Finding]:
        if self.config.pp_size <= 1:
            return []
        for req_id in (*step.finished, *step.preempted):
            self.reqs.pop(req_id, None)
        computed = {c.req_id: c.num_computed_tokens for c in step.cached}
        for new in step.new_requests:
            self.reqs[new.req_id] = _Request(new.prompt_len, new.max_tokens, new.num_prefill_tokens)
            computed[new.req_id] = new.num_computed_tokens
        out: list[Finding] = []
        early = set()
        for req_id in step.req_ids:
            req = self.reqs.get(req_id)
            if req is not None and req.sampled_at is not None \
                    and index - req.sampled_at < self.config.pp_size:
                early.add(req_id)
                out.append(Finding(
                    kind=fk.CONTRACT_VIOLATION_INPUT, step=index, stage=LIFECYCLE, check="pipeline",
                    req_ids=(req_id,), field=PP_DECODE_INTERVAL,
                    expected=f"scheduled at step >= {req.sampled_at + self.config.pp_size}",
                    actual=f"scheduled at step {index}",
                    message=f"{req_id} sampled at step {req.sampled_at} and is scheduled again "
                            f"{index - req.sampled_at} step(s) later, under pp_size "
                            f"{self.config.pp_size} (the broadcast ring is pp_size steps deep)"))
        out.extend(self._max_seq_len(index, step, obs, early))
        record = obs.get(PIPELINE, 0)
        judged = record is not None and record.error is None and obs.after_exception is None \
            and "batch.req_ids" in record.fields
        if judged:
            out.extend(_Judge(index, step, record.fields, self.reqs, computed, early,
                              self.config).findings())
        self._advance(index, step, computed, record.fields if record is not None else {})
        return out

    def _max_seq_len(self, index: int, step: Step, obs: StepObs, skip: set[str]) -> list[Finding]:
        """The last rank's InputBatch.max_seq_len_np: "[num_reqs] only populated for
        non-dummy pipeline-parallel batches", "consumed by the PP
        `compute_need_sampled_mask` for batches with prefill": each row's length cap,
        prompt_len + max_tokens (RequestState.max_seq_len), on a batch with a
        prefill row; None on one without (a release whose batch has no such field
        is not judged)."""
        real = obs.get(PREPARE)
        if real is None or real.error is not None or "max_seq_len_np" not in real.fields \
                or "req_ids" not in real.fields:
            return []
        ids = list(real.fields["req_ids"].values)
        if set(ids) & skip or any(r not in self.reqs for r in ids):
            return []
        field = real.fields["max_seq_len_np"]
        actual = None if field.kind == "none" else np.asarray(field.values).tolist()
        prefill = any(step.num_scheduled_tokens.get(r, 0) and self._prefilling(r, step) for r in ids)
        expected = [self.reqs[r].prompt_len + self.reqs[r].max_tokens for r in ids] if prefill else None
        if actual == expected:
            return []
        return [Finding(kind=fk.VALUE_MISMATCH, step=index, stage=PREPARE, check="pipeline",
                        req_ids=tuple(ids), field="max_seq_len_np", expected=str(expected),
                        actual=str(actual),
                        message="max_seq_len_np is not each row's prompt_len + max_tokens on a PP batch "
                                "with prefill (None without)")]

    def _prefilling(self, req_id: str, step: Step) -> bool:
        computed = next((c.num_computed_tokens for c in step.cached if c.req_id == req_id), None)
        if computed is None:
            computed = next(n.num_computed_tokens for n in step.new_requests if n.req_id == req_id)
        return computed < self.reqs[req_id].prefill_len

    def _advance(self, index: int, step: Step, computed: dict[str, int], fields: dict) -> None:
        last_ids = list(fields["last.req_ids"].values) if "last.req_ids" in fields else []
        drafts = fields.get("last.draft_tokens")
        sent = fields.get("broadcasts.sent")
        if sent is None or sent.values < 3:  # tokens and counts only: no drafts were broadcast
            drafts = None
        for req_id in step.req_ids:
            req = self.reqs.get(req_id)
            if req is None or req_id not in computed:
                continue
            if computed[req_id] + step.num_scheduled_tokens[req_id] >= req.prefill_len:
                req.sampled_at = index
                req.drafts = None
                if drafts is not None and req_id in last_ids:
                    req.drafts = [int(v) for v in np.asarray(drafts.values)[last_ids.index(req_id)]]


class _Judge:
    """One step's pipeline record against the last rank's and the trace."""

    def __init__(self, index: int, step: Step, fields: dict, reqs: dict[str, _Request],
                 computed: dict[str, int], skip: set[str], config: RunnerConfig) -> None:
        self.index, self.step, self.fields, self.reqs = index, step, fields, reqs
        self.computed, self.skip, self.config = computed, skip, config
        self.out: list[Finding] = []

    def value(self, name: str) -> object:
        """A field's values as plain Python (lists for arrays); None when absent."""
        field = self.fields.get(name)
        if field is None or field.values is None:
            return None
        return np.asarray(field.values).tolist() if not isinstance(field.values, list) else field.values

    def mismatch(self, field: str, req_ids: tuple[str, ...], expected: object, actual: object,
                 message: str, pattern: str = "differs_from_last_rank") -> None:
        """``pattern`` names the way it failed (a known finding's precise signature)."""
        self.out.append(Finding(kind=fk.VALUE_MISMATCH, step=self.index, stage=PIPELINE, check="pipeline",
                                rank=0, req_ids=req_ids, field=field, expected=str(expected),
                                actual=str(actual), message=message, extra={"pattern": pattern}))

    def findings(self) -> list[Finding]:
        left = self.value("broadcasts.unreceived")
        if left:
            self.mismatch("broadcasts.unreceived", tuple(self.step.req_ids), 0, left,
                          "the last rank broadcast tensors no other PP rank received", "left_over")
        ids, last_ids = self.value("batch.req_ids"), self.value("last.req_ids")
        if ids != last_ids:
            self.mismatch("req_ids", tuple(self.step.req_ids), last_ids, ids,
                          "the non-last PP rank ran another batch order than the last rank")
            return self.out
        if not self.value("received"):
            self.mismatch("received", tuple(ids), True, False,
                          "the non-last PP rank's sample_tokens never received the last rank's broadcast")
        self._rows(ids)
        self._mask(ids)
        return self.out

    def _rows(self, ids: list[str]) -> None:
        qsl, last_qsl = self.value("batch.query_start_loc"), self.value("last.query_start_loc")
        for i, req_id in enumerate(ids):
            if req_id in self.skip:
                continue
            for name in ("query_start_loc", "seq_lens"):
                mine, last = self.value("batch." + name), self.value("last." + name)
                if mine[i:i + 2] != last[i:i + 2]:
                    self.mismatch(name, (req_id,), last[i:i + 2], mine[i:i + 2],
                                  f"{name} of {req_id} on the non-last PP rank differs from the last rank's")
            if qsl[i:i + 2] != last_qsl[i:i + 2]:
                continue  # the token fields below cannot be lined up
            lo, hi = qsl[i], qsl[i + 1]
            drafts = self.step.spec_tokens.get(req_id, 0)
            plain = hi - drafts
            for name in ("positions", "input_ids"):
                mine, last = self.value("batch." + name)[lo:plain], self.value("last." + name)[lo:plain]
                if mine != last:
                    self.mismatch(name, (req_id,), last, mine,
                                  f"{name} of {req_id} on the non-last PP rank differ from the last rank's "
                                  f"(the sampled token it received, or its request state)")
            self._drafts(req_id, lo, plain, hi)
            accepted = self.computed.get(req_id, 0) + self.step.num_accepted(req_id)
            if self.value("last.num_computed_tokens")[i] != accepted:
                self.mismatch("last.num_computed_tokens", (req_id,), accepted,
                              self.value("last.num_computed_tokens")[i],
                              f"{req_id}'s num_computed_tokens after the last PP rank's step is not "
                              f"computed + scheduled - rejected")
            expected = self.computed.get(req_id, 0) + self.step.num_scheduled_tokens[req_id]
            actual = self.value("num_computed_tokens")[i]
            if actual != expected:
                self.mismatch("num_computed_tokens", (req_id,), expected, actual,
                              f"{req_id}'s num_computed_tokens after the non-last PP rank's step is not "
                              f"computed + scheduled (sample_tokens advances it optimistically)",
                              "behind_scheduled" if actual < expected else "past_scheduled")

    def _drafts(self, req_id: str, lo: int, plain: int, hi: int) -> None:
        req = self.reqs.get(req_id)
        if hi == plain or req is None or req.drafts is None:
            return
        mine = self.value("batch.input_ids")[plain:hi]
        sent = req.drafts[:hi - plain]
        if mine != sent:
            self.mismatch("draft_tokens", (req_id,), sent, mine,
                          f"the drafts {req_id} embeds on the non-last PP rank are not those the last rank "
                          f"broadcast at step {req.sampled_at}")

    def _mask(self, ids: list[str]) -> None:
        mask = self.value("need_sampled_mask") or [False] * len(ids)
        if len(mask) != len(ids):
            self.mismatch("need_sampled_mask", tuple(ids), f"{len(ids)} rows", f"{len(mask)} rows",
                          "need_sampled_mask does not have one entry per request")
            return
        must = []
        for i, req_id in enumerate(ids):
            req = self.reqs.get(req_id)
            if req_id in self.skip or req is None or req_id not in self.computed:
                continue
            before = self.computed[req_id]
            samples = before + self.step.num_scheduled_tokens[req_id] >= req.prefill_len
            length = before + self.step.num_accepted(req_id) + 1  # with the token it samples
            cap = min(req.prompt_len + req.max_tokens, self.config.max_model_len)
            if not samples and mask[i]:
                self.mismatch("need_sampled_mask", (req_id,), False, True,
                              f"{req_id} runs a non-final prefill chunk (samples nothing) but is marked "
                              f"as needing a sampled token", "marked_non_final_chunk")
            if samples and length < cap:
                must.append(req_id)
            if samples and length < cap and not mask[i]:
                self.mismatch("need_sampled_mask", (req_id,), True, False,
                              f"{req_id} samples this step and may run again (length {length} < {cap}) "
                              f"but is not marked: the non-last PP rank would never get its token",
                              "unmarked_continuing")
        if must and not self.value("broadcasts.sent"):
            self.mismatch("broadcasts.sent", tuple(must), ">= 2 (tokens, counts)", 0,
                          "requests that go on decoding sampled, but the last PP rank broadcast nothing")
