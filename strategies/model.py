"""A small model of the scheduler's side of the contract: request state only.

Each request moves through

    arrive --> waiting --(sent as new, prefill chunks)--> running --(decode / spec decode)--+
                 ^                                            |  |                        |
                 |                                  preempt   |  | finish / abort          |
                 +--- resume (new again, all tokens, --------+  +--> told in the next step's
                      prefix-cache hit)                               finished list

A resumable request (vLLM's streaming input) does not finish when its turn
stops: the session pauses, still held by the runner, until its next input
arrives (``stream_input``, queued while the turn runs); it is then sent as new
again with its live id (``NewRequest.streaming``): the prompt is the session's
tokens so far, the last sampled one dropped, plus the new input, resumed from
its computed tokens, with every block it holds (Scheduler._update_request_as_session,
_handle_stopped_request):

    running --(turn stops)--> paused --(input)--> streamed --(sent as new, streaming)--> running

and the model turns one scheduling decision (a ``Plan``) into one
``simrig.step.Step`` that obeys the contract the runner relies on:

    cached num_computed_tokens(k+1) == num_computed(k) + scheduled(k) - rejected(k)
    a request samples only once its prefill is done (then num_tokens grows)
    drafts only past prefill, drafts <= num_speculative_tokens, scheduled = 1 + drafts
      (but placeholder drafts: a request sent as new with one token left to compute may
      carry drafts no drafter proposed, every one rejected)
    sum(scheduled) <= max_num_batched_tokens, held requests <= max_num_reqs
    num_computed + scheduled <= max_model_len; a decode also leaves room for the token it
      samples: num_computed + scheduled + 1 <= max_model_len (vLLM's scheduler caps a running
      request at max_model_len - num_computed_tokens - num_sampled_tokens_per_step)

Each step also carries block ids from a ``strategies.blocks.BlockPool``:
a request sent as new gets its full block list (``NewRequest.block_ids``), a
cached one the blocks it newly needs (``CachedUpdate.new_block_ids``), enough
to hold the KV of every token up to the end of this step's query, one list per
KV cache group when the config has several (a sliding-window group first frees
the blocks below its window); finished and preempted requests give theirs back
before the step allocates.

It is plain Python (no Hypothesis) so strategies, the stateful machine and
tests share one definition of "valid".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simrig.sampling.params import SamplingSpec
from simrig.step import SYNTH_VOCAB_SIZE, CachedUpdate, NewRequest, RunnerConfig, Step, block_groups, synth_token
from strategies.blocks import BlockPool
from strategies.grammar import allowed_tokens

WAITING = "waiting"  # not held by the runner; sent as new when scheduled
RUNNING = "running"  # held by the runner
PREEMPTED = "preempted"  # released by the runner; waits for resume
FINISHED = "finished"
PAUSED = "paused"  # a streaming session between inputs: held by the runner, not scheduled
STREAMED = "streamed"  # a session with its next input: held; sent as new (streaming) when scheduled


def stream_token(req_id: str, turn: int, position: int) -> int:
    """The token a streaming input puts at ``position``: never the token the stand-in
    model samples there (``synth_token``), so an update the runner did not write shows
    in ``input_ids``."""
    return (synth_token(req_id, position) + 1 + turn % (SYNTH_VOCAB_SIZE - 1)) % SYNTH_VOCAB_SIZE


@dataclass
class Request:
    req_id: str
    prompt_len: int
    max_tokens: int
    num_tokens: int  # prompt + outputs the scheduler knows
    num_computed: int = 0
    prefill_len: int = 0  # tokens handed to the runner when last sent as new
    state: str = WAITING
    prefix_hit: int = 0  # tokens a prefix-cache hit covers when next sent as new
    lora_id: int | None = None  # its LoRA adapter (sent with every new request)
    resumable: bool = False  # a streaming session: a stopped turn pauses instead of finishing
    queued_input: tuple[int, int] | None = None  # (tokens, max_tokens) of its next input
    token_ids: list[int] | None = None  # explicit prompt ids once a streaming input arrived
    turn: int = 0  # streaming inputs received
    sampled_at: int | None = None  # the step index at which it last sampled (PP's interval)
    sampling: SamplingSpec | None = None  # its sampling parameters (sent with every new request)
    grammar: int = 0  # structured output: how many tokens its grammar allows (0: not structured)

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prefill_len

    @property
    def num_outputs(self) -> int:
        return self.num_tokens - self.prompt_len


@dataclass
class Row:
    """One scheduled request in a plan."""

    req_id: str
    num_tokens: int  # scheduled tokens, drafts included
    drafts: int = 0
    rejected: int = 0


@dataclass
class Plan:
    rows: list[Row] = field(default_factory=list)


class SchedulerModel:
    """Request state as the scheduler sees it, plus what the runner holds."""

    def __init__(self, config: RunnerConfig, id_prefix: str = "r"):
        config.validate()
        self.config = config
        self.id_prefix = id_prefix
        self.reqs: dict[str, Request] = {}
        self.pending_finished: list[str] = []  # told to the runner in the next step
        self.pending_preempted: list[str] = []  # released in the next step
        self.steps: list[Step] = []
        self.pool = BlockPool(config)
        self._next_id = 0

    # ------------------------------------------------------------ events
    def arrive(self, prompt_len: int, max_tokens: int, prefix_hit: int = 0,
               lora_id: int | None = None, sampling: SamplingSpec | None = None, grammar: int = 0) -> str:
        if not 1 <= prompt_len < self.config.max_model_len:  # room for one output token
            raise ValueError(f"prompt_len {prompt_len} outside 1..{self.config.max_model_len - 1}")
        if not 0 <= prefix_hit < prompt_len:
            raise ValueError(f"prefix_hit {prefix_hit} must leave a token to compute")
        self._check_min_tokens(sampling, max_tokens)
        if grammar and self.config.num_speculative_tokens:
            if not self.config.rejection_sampler:  # the trace reader refuses it
                raise ValueError("structured output under speculative decoding needs config.rejection_sampler")
            # under drafts a grammar is driven on a greedy request's spread rows only
            sampling = replace(sampling or SamplingSpec(), temperature=0.0)
        req_id = f"{self.id_prefix}{self._next_id}"
        self._next_id += 1
        self.reqs[req_id] = Request(req_id, prompt_len, max_tokens, num_tokens=prompt_len,
                                    prefix_hit=prefix_hit, lora_id=lora_id, sampling=sampling, grammar=grammar)
        return req_id

    @staticmethod
    def _check_min_tokens(sampling: SamplingSpec | None, max_tokens: int) -> None:
        # SamplingParams: "min_tokens must be less than or equal to max_tokens"
        if sampling is not None and sampling.min_tokens > max_tokens:
            raise ValueError(f"min_tokens {sampling.min_tokens} exceeds max_tokens {max_tokens}")

    def abort(self, req_id: str) -> None:
        req = self.reqs[req_id]
        if req.state in (PAUSED, STREAMED) or (req.state == RUNNING and req_id not in self.pending_preempted):
            self.pending_finished.append(req_id)
        req.state = FINISHED

    def preempt(self, req_id: str) -> None:
        req = self.reqs[req_id]
        assert req.state == RUNNING and req_id not in self.pending_preempted
        self.pending_preempted.append(req_id)

    def resume(self, req_id: str, prefix_hit: int) -> None:
        """A preempted request waits again; it is sent as new with all its tokens."""
        req = self.reqs[req_id]
        assert req.state == PREEMPTED
        if not 0 <= prefix_hit < req.num_tokens:
            raise ValueError(f"prefix_hit {prefix_hit} must leave a token to compute")
        req.state, req.prefix_hit = WAITING, prefix_hit

    def resend_as_new(self, req_id: str) -> None:
        """Adversarial: the next plan sends a request the runner still holds as new."""
        req = self.reqs[req_id]
        assert req.state == RUNNING and req_id not in self.pending_preempted
        req.state, req.prefix_hit = WAITING, 0

    def stream_input(self, req_id: str, num_tokens: int, max_tokens: int, stop_now: bool = False) -> None:
        """The session's next input: applied now to a paused session, queued until the
        turn stops for a running one (Scheduler.add_request: "Queue next input chunk").
        ``stop_now``: the running turn's last sampled token was a stop token, so the turn
        stops here (a request past its prefill only) and the input is taken at once."""
        req = self.reqs[req_id]
        assert req.state in (RUNNING, PAUSED) and req.queued_input is None and num_tokens >= 1
        self._check_min_tokens(req.sampling, max_tokens)  # the session keeps its sampling parameters
        req.resumable, req.queued_input = True, (num_tokens, max_tokens)
        if req.state == RUNNING and stop_now and not req.prefilling:
            req.state = PAUSED
        if req.state == PAUSED:
            self._take_input(req)

    def _take_input(self, req: Request) -> None:
        """Scheduler._update_request_as_session: every token but the last sampled one is
        kept and becomes prompt, the new input is appended, outputs start again."""
        assert req.queued_input is not None
        num_tokens, max_tokens = req.queued_input
        req.queued_input = None
        kept = req.num_tokens - 1
        assert kept >= req.num_computed
        num_tokens = min(num_tokens, self.config.max_model_len - 1 - kept)  # room for one output
        if num_tokens < 1:
            self.abort(req.req_id)
            return
        head = req.token_ids if req.token_ids is not None else [
            synth_token(req.req_id, p) for p in range(req.prompt_len)]
        head = head[:kept] + [synth_token(req.req_id, p) for p in range(len(head), kept)]
        req.turn += 1
        req.token_ids = head + [stream_token(req.req_id, req.turn, p) for p in range(kept, kept + num_tokens)]
        req.prompt_len = req.num_tokens = req.prefill_len = kept + num_tokens
        req.max_tokens, req.prefix_hit, req.state = max_tokens, 0, STREAMED

    # ------------------------------------------------------------ queries
    def held(self) -> list[Request]:
        return [r for r in self.reqs.values() if r.state == RUNNING]

    def sessions(self) -> list[Request]:
        """Streaming sessions between turns: held by the runner, not running."""
        return [r for r in self.reqs.values() if r.state in (PAUSED, STREAMED)]

    def streamable(self) -> list[Request]:
        """Requests a streaming input may go to: running (queued until the turn stops) or paused."""
        return [r for r in self.reqs.values() if r.queued_input is None and (
            r.state == PAUSED or (r.state == RUNNING and r.req_id not in self.pending_preempted))]

    def schedulable_running(self) -> list[Request]:
        return [r for r in self.held() if r.req_id not in self.pending_preempted]

    def preemptable(self) -> list[Request]:
        return self.schedulable_running()

    def waiting(self) -> list[Request]:
        """Requests sent as new when scheduled: waiting ones (a slot each) and
        streamed sessions (the slot they hold)."""
        return [r for r in self.reqs.values() if r.state in (WAITING, STREAMED)]

    def preempted(self) -> list[Request]:
        return [r for r in self.reqs.values()
                if r.state == PREEMPTED and r.req_id not in self.pending_preempted]

    def free_slots(self) -> int:
        # Preempted (and finished) requests are released before new ones are added.
        staying = [r for r in self.held() if r.req_id not in self.pending_preempted]
        return self.config.max_num_reqs - len(staying) - len(self.sessions())

    def max_rows(self, req: Request, budget: int) -> tuple[int, int]:
        """(max tokens, max drafts) req may be scheduled for under ``budget``."""
        if req.state == WAITING:
            remaining = req.num_tokens - req.prefix_hit
            return min(remaining, budget), 0
        if req.prefilling:
            return min(req.prefill_len - req.num_computed, budget), 0
        # drafts land at num_tokens..; the token sampled after them needs a place too
        room = self.config.max_model_len - req.num_tokens - 1
        drafts = min(self.config.num_speculative_tokens, budget - 1, room,
                     req.max_tokens - req.num_outputs - 1)
        return 1 + max(drafts, 0), max(drafts, 0)

    def placeholder_drafts(self, req: Request, budget: int) -> int:
        """Placeholder drafts a request sent as new may carry (0: none): with one
        token left to compute (a P/D remote KV load, or a resume whose prefix hit
        leaves one), the scheduler pads the step with drafts no drafter proposed.
        vLLM's rejection sampler rejects every one ("Draft rows of requests that
        have not yet sampled past their prefill are set to -1 so that the
        rejection kernels reject them", gather_draft_sampled), so such a row has
        rejected == drafts."""
        if req.state != WAITING or req.num_tokens - req.prefix_hit != 1:
            return 0
        room = self.config.max_model_len - req.num_tokens - 1
        return max(0, min(self.config.num_speculative_tokens, budget - 1, room,
                          req.max_tokens - req.num_outputs - 1))

    def can_schedule(self, req: Request) -> bool:
        if req.state == WAITING:
            return True
        if self._pp_waits(req):
            return False
        return req.prefilling or req.num_tokens < self.config.max_model_len

    def _pp_waits(self, req: Request) -> bool:
        """PP: a request that sampled at step k runs again at step k + pp_size at the
        earliest ("V2+PP+async: enforce `pp_size` steps between same-req decodes to match
        worker-side sampled-tokens broadcast slot ring cadence", Scheduler.schedule)."""
        return (self.config.pp_size > 1 and req.sampled_at is not None
                and len(self.steps) - req.sampled_at < self.config.pp_size)

    def cooling(self) -> list[Request]:
        """Running requests that wait only for PP's interval: while one does, a step
        that schedules nothing is valid (the non-last ranks' broadcast ring advances)."""
        return [r for r in self.schedulable_running() if self._pp_waits(r)]

    # ------------------------------------------------------------ steps
    def build_step(self, plan: Plan) -> Step:
        """Apply a plan: the Step the runner receives, then the sampler outcome."""
        cfg = self.config
        step = Step(finished=list(self.pending_finished), preempted=list(self.pending_preempted))
        for req_id in self.pending_preempted:
            req = self.reqs[req_id]
            if req.state == RUNNING:  # an abort between preempt and this step wins
                req.state = PREEMPTED
            req.num_computed, req.prefix_hit, req.sampled_at = 0, 0, None
        for req_id in (*self.pending_finished, *self.pending_preempted):
            self.pool.release(req_id)  # the runner drops them before this step's rows
        self.pending_finished, self.pending_preempted = [], []
        total = 0
        for row in plan.rows:
            req = self.reqs[row.req_id]
            assert row.req_id not in step.num_scheduled_tokens, f"{row.req_id} scheduled twice"
            placeholder = self.placeholder_drafts(req, cfg.max_num_batched_tokens - total)
            if req.state == WAITING:
                assert row.drafts == 0 or (row.drafts <= placeholder and row.rejected == row.drafts)
                assert len(self.held()) + len(self.sessions()) < cfg.max_num_reqs, "no free request slot"
                req.state, req.num_computed, req.prefill_len = RUNNING, req.prefix_hit, req.num_tokens
                kv_tokens = req.num_computed + row.num_tokens
                if req.req_id in self.pool.held:  # adversarial resend: the blocks it holds
                    self.pool.grow(req.req_id, kv_tokens)
                    block_ids = self.pool.blocks_of(req.req_id)
                else:
                    block_ids = self.pool.admit(req.req_id, kv_tokens, req.prefix_hit)
                step.new_requests.append(NewRequest(
                    req_id=req.req_id, prompt_len=req.prompt_len, num_computed_tokens=req.prefix_hit,
                    max_tokens=req.max_tokens,
                    prefill_len=req.num_tokens if req.num_tokens > req.prompt_len else None,
                    block_ids=block_ids, lora_id=req.lora_id, prompt_token_ids=req.token_ids,
                    sampling=req.sampling, structured_output=req.grammar > 0))
            elif req.state == STREAMED:  # a streaming update: its live id, every block it holds
                req.state = RUNNING
                self.pool.grow(req.req_id, req.num_computed + row.num_tokens, req.num_computed)
                step.new_requests.append(NewRequest(
                    req_id=req.req_id, prompt_len=req.prompt_len, num_computed_tokens=req.num_computed,
                    max_tokens=req.max_tokens, prompt_token_ids=list(req.token_ids or []) or None,
                    block_ids=self.pool.blocks_of(req.req_id), lora_id=req.lora_id, streaming=True,
                    sampling=req.sampling, structured_output=req.grammar > 0))
            else:
                assert req.state == RUNNING, f"{row.req_id} is {req.state}"
                new_blocks = self.pool.grow(req.req_id, req.num_computed + row.num_tokens,
                                            req.num_computed)
                step.cached.append(CachedUpdate(req.req_id, req.num_computed,
                                                new_block_ids=new_blocks if any(block_groups(new_blocks))
                                                else None))
            limit, max_drafts = self.max_rows(req, cfg.max_num_batched_tokens - total)
            assert 1 <= row.num_tokens <= limit + placeholder
            assert 0 <= row.rejected <= row.drafts <= max(max_drafts, placeholder)
            if row.drafts:
                assert row.num_tokens == 1 + row.drafts
                step.spec_tokens[row.req_id] = row.drafts
                if row.rejected:
                    step.rejected[row.req_id] = row.rejected
            assert req.num_computed + row.num_tokens <= cfg.max_model_len
            step.num_scheduled_tokens[row.req_id] = row.num_tokens
            total += row.num_tokens
        # vLLM's scheduler sends a step with no tokens when it only has finished
        # or preempted requests to report
        assert step.num_scheduled_tokens or step.finished or step.preempted or self.cooling(), \
            "a step schedules at least one request or reports one (or PP waits for its interval)"
        for row in plan.rows:  # sampler outcome
            req = self.reqs[row.req_id]
            req.num_computed += step.num_accepted(row.req_id)
            if req.num_computed >= req.prefill_len:  # prefill done: one token (+accepted drafts)
                if req.grammar:  # the scheduler lists it (not a prefill chunk), in its own order
                    step.grammar[row.req_id] = allowed_tokens(row.req_id, req.num_computed - 1, req.grammar,
                                                              req.sampling, SYNTH_VOCAB_SIZE)
                req.num_tokens = req.num_computed + 1
                req.sampled_at = len(self.steps)
                if req.num_tokens < cfg.max_model_len and req.resumable and req.num_outputs >= req.max_tokens:
                    req.state = PAUSED  # the turn stops; the session keeps its slot and blocks
                    if req.queued_input is not None:
                        self._take_input(req)
                elif req.num_outputs >= req.max_tokens or req.num_tokens >= cfg.max_model_len:
                    req.state = FINISHED
                    self.pending_finished.append(req.req_id)
        self.steps.append(step)
        return step
