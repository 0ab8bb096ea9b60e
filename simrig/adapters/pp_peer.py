"""Pipeline parallelism in one process: the non-last PP rank's runner next to the last rank's.

Under PP only the last rank samples; it broadcasts the sampled tokens (and its drafts)
through ``PPHandler`` (vllm/v1/worker/gpu/pp_utils.py), which a non-last rank applies
``pp_size`` steps later. simrig drives both ranks' real runners and real ``PPHandler``
objects in this process, with stand-ins only for what crosses between ranks: the ranks and
the stand-ins are tabled in ``make_pipeline_rank``; docs/standins.md has the rest.
"""

from __future__ import annotations

from typing import Any

from simrig import observe as obs
from simrig.adapters import standins
from simrig.adapters.probes import error_obs, wrap
from simrig.vllm_parts.pipeline import BroadcastMailbox, collectives, pp_handler  # noqa: F401 -- collectives: the harness reaches it here
from simrig.vllm_runtime import platform


class StageOutputStandIn(standins.ModelStandIn):
    """The forward of a stage that is not the last: returns the
    ``IntermediateTensors`` it would send on (zeros; nothing reads them)."""

    def __call__(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> Any:
        # lazy: vllm loads after platform.configure() sets its env
        from vllm.sequence import IntermediateTensors

        hidden = super().__call__(input_ids=input_ids, positions=positions, **kwargs)
        return IntermediateTensors({"hidden_states": hidden, "residual": hidden.clone()})


def make_pipeline_rank(runner: Any, rank: int, world_size: int, mailbox: BroadcastMailbox,
                       *, num_speculative_steps: int, device: Any) -> Any:
    """Turn an equipped runner into PP rank ``rank`` of ``world_size``, as
    ``GPUModelRunner.__init__`` sets it up: ``use_pp``, the rank's
    ``is_last_pp_rank`` and its ``PPHandler``; a non-last rank's forward
    returns intermediate tensors.

    Under PP every rank receives the same ``SchedulerOutput``; only the last rank
    samples, and it broadcasts the sampled tokens (and the drafts it proposes) to
    the other ranks through ``PPHandler`` (``vllm/v1/worker/gpu/pp_utils.py``).
    A non-last rank's ``sample_tokens`` receives them (``PPHandler.receive``),
    advances its ``num_computed_tokens`` optimistically
    (``postprocess_num_computed_tokens``) and applies the received tokens
    ``pp_size`` steps later, at the start of that step's ``execute_model``
    (``update_pp_decode_requests``). simrig drives both ranks' real runners, and
    both real ``PPHandler`` objects, in this process:

        rank                      runner                       PPHandler
        ────                      ──────                       ─────────
        last (pp_size - 1)        the harness's runner          is_last_rank: broadcast,
                                  (samples, as without PP)      broadcast_drafts
        non-last (0)              a second runner, equipped     receive, get_prev_sampled_outputs
                                  the same way, PP rank 0       (a ring of pp_size entries)

    Stand-ins, only for what crosses between ranks (docs/standins.md):

        stand-in              replaces                                   why
        ────────              ────────                                   ───
        PipelineGroupStandIn  vLLM's PP GroupCoordinator (get_pp_group   no process group in one process;
                              at PPHandler construction)                 answers rank, first/last rank,
                                                                         world size, a sibling group
        BroadcastMailbox      torch.distributed.broadcast on the PP      the last rank's broadcasts are
                              broadcast group                            queued and handed, in order, to
                                                                         the non-last rank's receives
        StageOutputStandIn    the non-last rank's forward output         needs weights: returns empty
                              (IntermediateTensors)                      IntermediateTensors of the shape
                                                                         the next stage is sent

    Every non-last rank runs the same code on the same inputs and receives the
    same broadcast, so one non-last runner stands for ranks 0 .. pp_size - 2; the
    ring it keeps is ``pp_size`` entries deep, as ``PPHandler`` sizes it from the
    group's world size. The last rank is driven as the first rank too
    (``is_first_pp_rank`` True): the hidden states the first stage would send it
    carry no values with the stand-in model, so it embeds its own tokens and the
    rig's input checks keep judging them.
    """
    import torch  # lazy: torch loads only when this runs

    last = rank == world_size - 1
    runner.use_pp = True
    runner.is_last_pp_rank = last
    runner.is_first_pp_rank = True  # see the module docstring
    runner.pp_handler = pp_handler(rank, world_size, mailbox, max_num_reqs=runner.max_num_reqs,
                                   num_speculative_steps=num_speculative_steps, device=device)
    # the cudagraph manager reads the rank in its __init__ too (get_pp_group().is_last_rank):
    # a non-last rank's graphs keep intermediate tensors, not hidden states
    if hasattr(runner.cudagraph_manager, "is_last_pp_rank"):
        runner.cudagraph_manager.is_last_pp_rank = last
    if not last:
        runner.model = StageOutputStandIn(torch, device, runner.vocab_size)
    return runner


class NonLastRank:
    """Steps the non-last PP rank's runner after the last rank's, on the same
    ``SchedulerOutput``, and records what the oracle compares (the ``pipeline``
    stage, rank 0; checks/pp_ranks.py):

        batch.*                 the batch this rank ran (the global batch under PCP,
                                as sample_tokens receives on it): req_ids, input_ids,
                                positions, seq_lens, query_start_loc
        last.*                  the same fields of the last rank's batch
        need_sampled_mask       the mask PPHandler.receive kept (None: nothing received)
        num_computed_tokens     this rank's req_states after its sample_tokens, per row
        last.num_computed_tokens  the last rank's, per row, after its sample_tokens
        last.draft_tokens       the drafts the last rank proposed (what broadcast_drafts sends)
        broadcasts.sent         the last rank's broadcasts this step (tokens, counts, drafts)
        broadcasts.unreceived   broadcasts of this step no receive took
    """

    def __init__(self, runner: Any, mailbox: BroadcastMailbox) -> None:
        self.runner = runner
        self.mailbox = mailbox
        self._batch: Any = None
        self._mask: Any = None
        self._received = False
        wrap(runner, "prepare_inputs", self._on_prepare)
        if runner.pcp_manager is not None:
            wrap(runner.pcp_manager, "partition_batch", self._on_partition)
        wrap(runner.pp_handler, "receive", self._on_receive)

    def start_up(self, step: Any) -> Any:
        """This rank's ``capture_model``, as every rank captures at start-up (a
        FULL step replays this rank's own graph); None, or the ``pipeline``
        stage record of its exception (that rank would not start)."""
        manager = self.runner.cudagraph_manager
        if not manager.needs_capture():
            return None
        manager._graphs_captured = False
        try:
            with platform.graph_capture_without_cuda():
                self.runner.capture_model()
        except Exception as exc:  # a failed capture is an observation
            return obs.StageObs(stage=obs.PIPELINE, rank=0, error=error_obs(exc, step))
        finally:
            platform.unlock_workspace()
        return None

    def _on_prepare(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        batch = call(*args, **kwargs)
        if self._batch is None:
            self._batch = batch
        return batch

    def _on_partition(self, call: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        self._batch = input_batch  # under PCP: the global batch (what sample_tokens receives on)
        return call(input_batch, *args, **kwargs)

    def _on_receive(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        value = call(*args, **kwargs)
        queue = self.runner.pp_handler.queue
        pending = queue[-1] if queue else None
        self._mask = None if pending is None else [bool(v) for v in pending.need_sampled_mask]
        self._received = True
        return value

    def step(self, scheduler_output: Any, last_runner: Any, last_batch: Any, step: Any,
             grammar: Any = None) -> Any:
        """This rank's execute_model and sample_tokens (handed the last rank's grammar
        output, as every rank is); every exception is an observation on the returned record."""
        record = obs.StageObs(stage=obs.PIPELINE, rank=0)
        self._batch, self._mask, self._received = None, None, False
        if last_batch is not None:
            record.fields.update(_batch_fields(last_batch, "last."))
            record.fields.update(_row_state(last_runner, last_batch, "last."))
        try:
            self.runner.execute_model(scheduler_output)
            if last_batch is not None:  # a step with no forward samples nothing
                with collectives(self.mailbox):
                    self.runner.sample_tokens(grammar)
        except Exception as exc:  # vLLM's exceptions (and the ranks disagreeing) are observations
            record.error = error_obs(exc, step)
        finally:
            self.runner.execute_model_state = None
            record.fields["broadcasts.sent"] = obs.observe_value(self.mailbox.sent)
            record.fields["broadcasts.unreceived"] = obs.observe_value(self.mailbox.clear())
        if self._batch is not None and record.error is None:
            record.fields.update(_batch_fields(self._batch, "batch."))
            record.fields.update(_row_state(self.runner, self._batch, "", drafts=False))
            record.fields["need_sampled_mask"] = obs.observe_value(self._mask)
            record.fields["received"] = obs.observe_value(self._received)
        return record


def _batch_fields(batch: Any, prefix: str) -> dict[str, Any]:
    num_reqs, num_tokens = int(batch.num_reqs), int(batch.num_tokens)
    values = {"req_ids": list(batch.req_ids),
              "input_ids": batch.input_ids[:num_tokens], "positions": batch.positions[:num_tokens],
              "seq_lens": batch.seq_lens[:num_reqs], "query_start_loc": batch.query_start_loc[:num_reqs + 1]}
    return {prefix + k: obs.observe_value(v) for k, v in values.items()}


def _row_state(runner: Any, batch: Any, prefix: str, drafts: bool = True) -> dict[str, Any]:
    """The runner's request state of the batch's rows (its own slots, in batch order)."""
    slots = batch.idx_mapping[:int(batch.num_reqs)].long()
    states = runner.req_states
    out = {prefix + "num_computed_tokens": obs.observe_value(states.num_computed_tokens.gpu[slots])}
    if drafts and runner.num_speculative_steps > 0:
        out[prefix + "draft_tokens"] = obs.observe_value(states.draft_tokens[slots])
    return out
