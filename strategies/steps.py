"""Strategies for scheduler steps that obey the runner's contract.

``scheduler_steps(config=...)`` draws a whole life: arrivals, chunked
prefills, decodes, spec decodes with rejections, finishes, aborts,
preemptions and resumes (sent again as new requests carrying all their
tokens, possibly with a prefix-cache hit). Every step is built by
``strategies.model.SchedulerModel``, the single definition of "valid".

One step's plan, in the scheduler's order (running first, then waiting):

    running r0: prefilling  -> chunk 1..remaining        (full chunk is the simplest)
    running r1: decoding    -> 1 + k drafts, k <= num_speculative_tokens, rejected <= k
    waiting r2: new/resumed -> chunk 1..remaining - prefix hit; with one token left
                               (a P/D remote KV load), maybe 1 + k placeholder drafts,
                               all rejected
    ... until the token budget or the request slots run out
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from simrig.sampling.params import SamplingSpec
from simrig.step import RunnerConfig, Step
from strategies._validate import check_int
from strategies.blocks import tokens_per_block
from strategies.configs import runner_configs
from strategies.grammar import grammar_sizes
from strategies.model import PAUSED, WAITING, Plan, Row, SchedulerModel
from strategies.requests import lora_ids, prefix_cache_hits, prompt_lengths
from strategies.sampling import request_sampling, within_max_tokens

Draw = Callable[[st.SearchStrategy[Any]], Any]


def draw_plan(draw: Draw, model: SchedulerModel) -> Plan | None:
    """Draw one scheduling decision for ``model`` (None: nothing schedulable).

    Shared by the ``scheduler_steps`` strategy and the stateful machine, whose
    rules pass ``data.draw``. Choices shrink towards "schedule everyone, whole
    prefills, no drafts, no rejections".
    """
    cfg = model.config
    budget = cfg.max_num_batched_tokens
    slots = model.free_slots()
    rows: list[Row] = []
    candidates = [r for r in model.schedulable_running() if model.can_schedule(r)]
    candidates += model.waiting()
    for req in candidates:
        if budget <= 0:
            break
        is_new = req.state == WAITING
        if is_new and slots <= 0:
            continue
        # Skip one in four (the budget or policy may leave a request out);
        # shrinks to "schedule it". The first candidate is never left out.
        if rows or req is not candidates[0]:
            if draw(st.integers(0, 3)) == 3:
                continue
        limit, max_drafts = model.max_rows(req, budget)
        if limit < 1:
            continue
        if not (is_new or req.prefilling):  # decode, maybe with drafts
            drafts = draw(st.integers(0, max_drafts)) if max_drafts else 0
            rejected = draw(st.integers(0, drafts)) if drafts else 0
            row = Row(req.req_id, 1 + drafts, drafts, rejected)
        elif is_new and model.placeholder_drafts(req, budget) and draw(st.booleans()):
            # the first step after a P/D remote KV load: the last prompt token and
            # placeholder drafts, all rejected
            drafts = draw(st.integers(1, model.placeholder_drafts(req, budget)))
            row = Row(req.req_id, 1 + drafts, drafts, drafts)
        else:
            chunked = draw(st.booleans())
            row = Row(req.req_id, draw(st.integers(1, limit)) if chunked and limit > 1 else limit)
        rows.append(row)
        budget -= row.num_tokens
        slots -= is_new
    if not rows:
        return None
    return Plan(rows)


def draw_large_plan(draw: Draw, model: SchedulerModel) -> Plan | None:
    """The largest step the model allows now: every schedulable request, in the
    scheduler's order, whole prefill chunks and every draft a decode may carry,
    until the token budget or the request slots run out (None: nothing to schedule)."""
    budget, slots, rows = model.config.max_num_batched_tokens, model.free_slots(), []
    for req in [r for r in model.schedulable_running() if model.can_schedule(r)] + model.waiting():
        is_new = req.state == WAITING
        if budget <= 0 or (is_new and slots <= 0):
            continue
        limit, max_drafts = model.max_rows(req, budget)
        if limit < 1:
            continue
        if is_new or req.prefilling:
            row = Row(req.req_id, limit)
        else:
            row = Row(req.req_id, 1 + max_drafts, max_drafts, draw(st.integers(0, max_drafts)))
        rows.append(row)
        budget -= row.num_tokens
        slots -= is_new
    return Plan(rows) if rows else None


def draw_small_plan(draw: Draw, model: SchedulerModel) -> Plan | None:
    """One request for one token (a decode, or a one-token prefill chunk); a decode may
    instead carry all its drafts (a uniform decode batch). None: nothing to schedule."""
    running = [r for r in model.schedulable_running() if model.can_schedule(r)]
    candidates = running or (model.waiting() if model.free_slots() > 0 else [])
    if not candidates:
        return None
    req = draw(st.sampled_from(candidates))
    limit, max_drafts = model.max_rows(req, model.config.max_num_batched_tokens)
    if limit < 1:
        return None
    if req.state != WAITING and not req.prefilling and max_drafts and draw(st.booleans()):
        return Plan([Row(req.req_id, 1 + max_drafts, max_drafts, draw(st.integers(0, max_drafts)))])
    return Plan([Row(req.req_id, 1)])


def draw_event(draw: Draw, model: SchedulerModel, max_new_tokens: int,
               sampling: st.SearchStrategy[Any] | None = None) -> None:
    """Between steps: maybe an arrival, abort, preemption, resume or streaming input. An
    arrival carries a draw of ``sampling`` (default ``request_sampling()``), which every
    later resend of the request (resume, streaming update) carries again, and is
    structured output now and then (``strategies.grammar``)."""
    cfg = model.config
    kind = draw(st.sampled_from(("none", "arrive", "abort", "preempt", "resume", "stream")))
    if kind == "arrive" or not model.reqs:
        prompt_len = draw(prompt_lengths(max_model_len=cfg.max_model_len))
        hit = draw(prefix_cache_hits(prompt_len, block_size=tokens_per_block(cfg)))
        if cfg.num_speculative_tokens and prompt_len > 1 and draw(st.integers(0, 3)) == 0:
            hit = prompt_len - 1  # P/D: every prompt token's KV but the last loaded remotely
        max_tokens = draw(st.integers(1, max_new_tokens))
        lora_id = draw(lora_ids(cfg.max_loras)) if cfg.max_loras else None
        spec = draw(request_sampling() if sampling is None else sampling)
        model.arrive(prompt_len, max_tokens, hit, lora_id, within_max_tokens(spec, max_tokens),
                     draw(grammar_sizes(cfg)))
    elif kind == "abort" and model.held():
        model.abort(draw(st.sampled_from([r.req_id for r in model.held()])))
    elif kind == "preempt" and model.preemptable():
        model.preempt(draw(st.sampled_from([r.req_id for r in model.preemptable()])))
    elif kind == "resume" and model.preempted():
        req = draw(st.sampled_from(model.preempted()))
        model.resume(req.req_id, draw(prefix_cache_hits(req.num_tokens, block_size=tokens_per_block(cfg))))
    elif kind == "stream" and model.streamable():
        draw_stream_input(draw, model, max_new_tokens)


def draw_stream_input(draw: Draw, model: SchedulerModel, max_new_tokens: int) -> None:
    """A streaming session's next input (queued while its turn runs, or the turn stops
    now, as on a stop token), or, for a paused session, sometimes its end (vLLM finishes
    a session whose input stream closed)."""
    req = draw(st.sampled_from(model.streamable()))
    if req.state == PAUSED and draw(st.integers(0, 3)) == 3:
        model.abort(req.req_id)
        return
    room = max(1, model.config.max_model_len // 4)
    num_tokens, max_tokens = draw(st.integers(1, room)), draw(st.integers(1, max_new_tokens))
    if req.sampling is not None:  # the session's sampling parameters stay; its min_tokens fits each turn
        max_tokens = max(max_tokens, req.sampling.min_tokens)
    # a running turn past its prefill may stop now (its last token a stop token)
    stop_now = req.state != PAUSED and not req.prefilling and draw(st.integers(0, 3)) > 0
    model.stream_input(req.req_id, num_tokens, max_tokens, stop_now)


@st.composite
def _scheduler_steps(draw, config: st.SearchStrategy[RunnerConfig], min_steps: int,
                     max_steps: int, max_new_tokens: int, sampling: st.SearchStrategy[Any]) -> list[Step]:
    cfg = draw(config)
    model = SchedulerModel(cfg)
    target = draw(st.integers(min_steps, max_steps))
    attempts = 0
    while len(model.steps) < target and attempts < 4 * max_steps + 8:
        attempts += 1
        draw_event(draw, model, max_new_tokens, sampling)
        plan = draw_plan(draw, model)
        if plan is not None:
            model.build_step(plan)
    return model.steps


def scheduler_steps(*, config: st.SearchStrategy[RunnerConfig] | None = None, min_steps: int = 1,
                    max_steps: int = 10, max_new_tokens: int = 16,
                    sampling: st.SearchStrategy[SamplingSpec | None] | None = None
                    ) -> st.SearchStrategy[list[Step]]:
    """Lists of ``simrig.step.Step`` a correct scheduler could send, in order.

    ``config`` is a strategy for the runner config the steps are valid under
    (default ``runner_configs()``); draw it with ``st.shared`` to obtain the
    config a given list was made for, or use ``scheduled_runs()``. ``sampling`` draws
    each arriving request's sampling parameters (default ``request_sampling()``: a spec
    for about a third of them; ``st.none()``: vLLM's defaults for all); a spec's
    ``min_tokens`` is lowered to the request's ``max_tokens`` where it is above.
    """
    from strategies._validate import check_strategy

    config = runner_configs() if config is None else check_strategy("config", config)
    sampling = request_sampling() if sampling is None else check_strategy("sampling", sampling)
    check_int("min_steps", min_steps, minimum=0)
    check_int("max_steps", max_steps, minimum=max(min_steps, 1))
    check_int("max_new_tokens", max_new_tokens, minimum=1)
    return _scheduler_steps(config, min_steps, max_steps, max_new_tokens, sampling)


def scheduled_runs(*, config: st.SearchStrategy[RunnerConfig] | None = None, min_steps: int = 1,
                   max_steps: int = 10, max_new_tokens: int = 16,
                   sampling: st.SearchStrategy[SamplingSpec | None] | None = None
                   ) -> st.SearchStrategy[tuple[RunnerConfig, list[Step]]]:
    """``(config, steps)`` pairs: the steps are valid under that config (``sampling``
    as in ``scheduler_steps``)."""
    from strategies._validate import check_strategy

    config = runner_configs() if config is None else check_strategy("config", config)
    if sampling is not None:
        check_strategy("sampling", sampling)

    @st.composite
    def build(draw) -> tuple[RunnerConfig, list[Step]]:
        cfg = draw(config)
        return cfg, draw(scheduler_steps(config=st.just(cfg), min_steps=min_steps, max_steps=max_steps,
                                         max_new_tokens=max_new_tokens, sampling=sampling))

    return build()


def scheduler_step(*, config: st.SearchStrategy[RunnerConfig] | None = None
                   ) -> st.SearchStrategy[Step]:
    """A single first step (only new requests) under a config's budget and slots."""
    return scheduler_steps(config=config, min_steps=1, max_steps=1).map(lambda steps: steps[0])
