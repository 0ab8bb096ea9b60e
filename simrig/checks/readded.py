"""The state the runner keeps for each request a step adds, a streaming-input update above all.

A request sent as new (a first arrival, a resume after preemption, or a streaming-input
update of a request the runner still holds) is written into one slot by ``add_requests``;
the lifecycle stage observes what that slot now holds (``runner.added.*``), and
``check_added_state`` holds each value to its meaning, never to vLLM's code (the table is
in its docstring). See docs/oracle.md, 'Fields beyond the reference model'.
"""

from __future__ import annotations

from typing import Any

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import LIFECYCLE, StepObs
from simrig.step import RunnerConfig, Step, block_groups


@guarded("readded")
def check_added_state(index: int, config: RunnerConfig, step: Step, obs: StepObs,
                      skip: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings for each ``runner.added.*`` value that is not its request's (module docstring).

    A request sent as new (first arrival, a resume after preemption, or a
    streaming-input update of a request the runner still holds) is written into
    one slot by ``add_requests``; the lifecycle stage observes, per added request
    (``runner.added.*``, in the step's order), what that slot now holds, and each
    value is held to its meaning, never to vLLM's code:

        field                      expectation                         source (vLLM 0.33.0)
        ─────                      ───────────                         ────────────────────
        runner.added.req_ids       every request the step added         add_requests adds each of
                                   (streaming updates included)         scheduled_new_reqs
        runner.added.prompt_len    the request's prompt length           RequestState: "prompt_len: Number
                                   (a streaming update's: the session's  of tokens in the user-provided
                                   tokens so far plus the new input)     prompt"
        runner.added.prefill_len   the tokens handed to the runner       "prefill_len: Number of tokens
                                                                         passed into the model runner"
        runner.added.num_computed  the request's num_computed_tokens     NewRequestData.num_computed_tokens
                                   (a streaming update: its resume       (the scheduler's "materialized
                                   point, not the runner's old count)    frontier" for a resumed session)
        runner.added.token_ids     the prefill tokens, in order: for a   all_token_ids holds the tokens
                                   streaming update the kept tokens and  passed in; add_requests: "re-added
                                   then the appended input               ... with the updated
                                                                         prompt_token_ids"
        runner.added.num_blocks    per KV cache group, the request's     NewRequestData.block_ids, written
                                   block count: its whole list, never    with append_block_ids(...,
                                   its old row extended                  overwrite=True)

    The slot a streaming update lands in is not predicted (add_requests: "Remove
    old state so it can be cleanly re-added": any free slot, its old one freed);
    checks/fields.py's runner_state holds the live and free slots to every slot
    once, and the reference model learns the new slot afresh.
    """
    stage = obs.get(LIFECYCLE)
    if stage is None or stage.error is not None or "runner.added.req_ids" not in stage.fields:
        return []
    out: list[Finding] = []

    def add(field: str, req_ids: tuple[str, ...], expected: Any, actual: Any, msg: str) -> None:
        out.append(Finding(kind=fk.VALUE_MISMATCH, step=index, stage=LIFECYCLE, check="readded",
                           req_ids=req_ids, field=field, expected=str(expected)[:400],
                           actual=str(actual)[:400], message=msg))

    got_ids = [str(r) for r in stage.fields["runner.added.req_ids"].values]
    want_ids = [r.req_id for r in step.new_requests]
    if got_ids != want_ids:
        add("runner.added.req_ids", tuple(r for r in set(want_ids) ^ set(got_ids) if r not in skip)
            or tuple(want_ids), want_ids, got_ids, "the runner does not hold every request this step added")
        return out
    values = {name: list(stage.fields[name].values) for name in stage.fields
              if name.startswith("runner.added.")}
    for i, req in enumerate(step.new_requests):
        if req.req_id in skip:
            continue
        kind = "streaming update" if req.streaming else "new request"
        blocks = [len(g) for g in block_groups(req.block_ids, config.num_kv_groups)]
        for field, want, meaning in (
                ("prompt_len", req.prompt_len, "its prompt length"),
                ("prefill_len", req.num_prefill_tokens, "the tokens handed to the runner"),
                ("num_computed", req.num_computed_tokens, "its num_computed_tokens"),
                ("token_ids", req.prefill_token_ids(), "its prefill tokens"),
                ("num_blocks", blocks, "its block count per group")):
            name = f"runner.added.{field}"
            if name not in values or i >= len(values[name]):
                continue
            got = values[name][i]
            got = [int(x) for x in got] if isinstance(got, list) else int(got)
            if got != want:
                add(name, (req.req_id,), want, got,
                    f"{kind} {req.req_id}: the runner's slot does not hold {meaning}")
    return out
