"""The LoRA mapping a real step hands the LoRA manager, from what each entry means.

The harness observes the three arguments of ``_set_active_loras`` (``lora.prompt_mapping``,
``lora.token_mapping``, ``lora.active_ids``); ``check_lora_inputs`` derives each from the
trace's adapters alone (``AdapterTracker``), never from vLLM's slots or arrays (its
docstring tables the rules and their sources). ``slot_reuses`` recognises the axis from a
trace. See docs/cudagraph.md, 'The LoRA dispatch rules'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import LIFECYCLE, StageObs, StepObs
from simrig.step import Step

CHECK = "lora_inputs"
FIELDS = ("lora.prompt_mapping", "lora.token_mapping", "lora.active_ids")


def _values(record: StageObs, name: str) -> list:
    f = record.fields.get(name)
    return [] if f is None or f.values is None else list(f.values)


def _mismatch(index: int, record: StageObs, name: str, expected: Any, actual: Any,
              req_ids: tuple[str, ...], message: str) -> Finding:
    return Finding(kind=fk.VALUE_MISMATCH, step=index, stage=record.stage, rank=record.rank,
                   check=CHECK, req_ids=req_ids, field=name, expected=str(expected)[:300],
                   actual=str(actual)[:300], message=message)


@guarded(CHECK)
def check_lora_inputs(index: int, step: Step, record: StageObs | None, adapter: Mapping[str, int],
                      local_counts: bool, skip: Iterable[str] = ()) -> list[Finding]:
    """The step's LoRA mapping against the trace's adapters (the module's rules).
    ``record`` is the forward batch's record; ``local_counts``: count tokens from its own
    ``num_scheduled_tokens`` (a PCP rank's share) instead of the step's.

    ``execute_model`` activates adapters with ``_set_active_loras(prompt_lora_mapping,
    token_lora_mapping, lora_requests)`` (built by ``LoraState.make_lora_inputs``); the
    harness observes the three arguments on the record of the batch they were built
    from (``lora.prompt_mapping``, ``lora.token_mapping``, ``lora.active_ids``: the
    global batch, or PCP rank 0's rank-local one). The oracle derives each from the
    trace's adapters alone (``AdapterTracker``: a request's ``lora_id`` as it was last
    sent new), never from vLLM's slots or arrays:

        rule                                        source (vLLM 0.33.0)
        ────                                        ────────────────────
        PER REQUEST: entry i is the adapter id of   lora/punica_wrapper/utils.py convert_mapping:
          the batch's i-th request, 0 when it runs   "LoRAMapping mapping rows in a batch to LoRA ids";
          the base model; one entry per request      sampler_indices "mapping requests to LoRA
                                                     indices for sampler ... For prefill, this will map
                                                     requests to LoRA indices"; ids "> 0" are adapters
                                                     (``if x > 0 else -1``); lora_utils.NO_LORA_ID = 0
        PER TOKEN: one entry per scheduled token,   v1/worker/gpu_input_batch.py make_lora_inputs:
          in batch order, each its request's         "token_lora_mapping: A tuple of size
          adapter id (0: none); padded tokens have   np.sum(num_scheduled_tokens) where,
          no entry                                   token_lora_mapping[i] is the LoRA id to use for
                                                     ith token"
        ACTIVE SET: the distinct adapters of the    the same: "lora_requests: Set of relevant LoRA
          batch's requests, and no other             requests"; LoraState: "req_id -> lora_request"

    A slot a request with adapter A left, taken by a request with adapter B or none,
    must map to B or 0: the rules read the request's own adapter, so a stale A is a
    ``value_mismatch`` whatever the slot holds. Under PCP the per-token rule counts
    the rank-local tokens of PCP rank 0 (the partition's own ``num_scheduled_tokens``,
    judged by the partition checks); otherwise the step's scheduled counts.

    ``slot_reuses`` recognises the axis from a trace and the runner's observed slots:
    a new request takes a slot that an earlier request with another adapter held.
    """
    if record is None or "lora.prompt_mapping" not in record.fields:
        return []
    req_ids = tuple(str(r) for r in _values(record, "req_ids"))
    if set(req_ids) & set(skip):  # a request set aside after a contract violation
        return []
    per_request = [adapter.get(r, 0) for r in req_ids]
    if local_counts:
        counts = [int(n) for n in _values(record, "num_scheduled_tokens")][:len(req_ids)]
    else:
        counts = [step.num_scheduled_tokens.get(r, 0) for r in req_ids]
    per_token = [a for a, n in zip(per_request, counts) for _ in range(n)]
    active = sorted({a for a in per_request if a})
    out = []
    prompt = [int(a) for a in _values(record, "lora.prompt_mapping")]
    if prompt != per_request:
        wrong = tuple(r for r, e, a in zip(req_ids, per_request, prompt) if e != a) or req_ids
        out.append(_mismatch(index, record, "lora.prompt_mapping", per_request, prompt, wrong,
                             f"the per-request adapter ids are {prompt}; the batch's requests "
                             f"{list(req_ids)} run adapters {per_request} (0: none)"))
    tokens = [int(a) for a in _values(record, "lora.token_mapping")]
    if tokens != per_token:
        first = next((i for i, (e, a) in enumerate(zip(per_token, tokens)) if e != a),
                     min(len(tokens), len(per_token)))
        out.append(_mismatch(index, record, "lora.token_mapping",
                             f"{len(per_token)} tokens, from {per_token[first:first + 8]} at {first}",
                             f"{len(tokens)} tokens, from {tokens[first:first + 8]} at {first}",
                             req_ids, "each scheduled token maps to its request's adapter id "
                             f"(0: none); token {first} differs"))
    got = [int(a) for a in _values(record, "lora.active_ids")]
    if got != active:
        out.append(_mismatch(index, record, "lora.active_ids", active, got, req_ids,
                             f"the adapters set active are {got}; the batch's requests run {active}"))
    return out


def slot_reuses(step: Step, observation: StepObs, held: dict[int, int],
                adapter: Mapping[str, int]) -> list[tuple[str, int, int, int]]:
    """LoRA slot reuse at this step: (request, slot, adapter the slot last held, the
    request's adapter or 0) for each new request whose runner slot (the lifecycle's
    observed ``runner.live_slots``) was last held by a request with another adapter,
    at least one of the two an adapter. ``held`` (slot -> adapter of its last holder,
    0: none) carries over from step to step and is updated here."""
    life = observation.get(LIFECYCLE)
    if life is None or "runner.live_ids" not in life.fields:
        return []
    slots = dict(zip(life.fields["runner.live_ids"].values, life.fields["runner.live_slots"].values))
    out = []
    for req in step.new_requests:
        slot = slots.get(req.req_id)
        if slot is None:
            continue
        mine, before = adapter.get(req.req_id, 0), held.get(int(slot))
        if before is not None and before != mine and (before or mine):
            out.append((req.req_id, int(slot), before, mine))
        held[int(slot)] = mine
    return out
