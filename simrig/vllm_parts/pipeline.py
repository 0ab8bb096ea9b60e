"""vLLM's PPHandler built without a process group, and the PP broadcast in one process.

``PPHandler.__init__`` reads the PP ``GroupCoordinator`` (``get_pp_group()``)
and makes a sibling device group for the sampled-token broadcast; its
``broadcast`` / ``receive`` / ``broadcast_drafts`` call
``torch.distributed.broadcast`` on that group. In one process the group is
``PipelineGroupStandIn`` and the broadcast is ``BroadcastMailbox``: the last
rank's tensors are queued and handed, in order, to the other rank's receives
(adapters/pp_peer.py drives both ranks; docs/standins.md lists both stand-ins).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from typing import Any

from simrig.vllm_runtime import platform


class PipelineBroadcastError(RuntimeError):
    """The ranks disagree on a broadcast: on real ranks, a hang or garbage."""


class _BroadcastGroup:
    """What ``make_sibling_device_group`` returns: the calling rank and the mailbox."""

    def __init__(self, rank: int, mailbox: "BroadcastMailbox") -> None:
        self.rank = rank
        self.mailbox = mailbox


class PipelineGroupStandIn:
    """vLLM's PP ``GroupCoordinator`` as ``PPHandler.__init__`` reads it."""

    def __init__(self, rank: int, world_size: int, mailbox: "BroadcastMailbox") -> None:
        self.rank_in_group = rank
        self.world_size = world_size
        self.ranks = list(range(world_size))
        self.first_rank = self.ranks[0]
        self.last_rank = self.ranks[-1]
        self.is_first_rank = rank == self.first_rank
        self.is_last_rank = rank == self.last_rank
        self._mailbox = mailbox

    def make_sibling_device_group(self, group_desc: str | None = None) -> _BroadcastGroup:
        return _BroadcastGroup(self.rank_in_group, self._mailbox)


class BroadcastMailbox:
    """``torch.distributed.broadcast`` between ranks of this process: the
    source rank's tensors are queued in order; a receiving rank's call takes
    the oldest one into its tensor. A receive with nothing queued, or of
    another shape or dtype, is the ranks disagreeing (a hang or garbage on
    real ranks): ``PipelineBroadcastError``."""

    def __init__(self) -> None:
        self.queued: deque[Any] = deque()
        self.sent = 0  # broadcasts this step (the harness reads and clears them)
        self.received = 0

    def broadcast(self, tensor: Any, src: int = 0, group: Any = None, async_op: bool = False) -> None:
        if not isinstance(group, _BroadcastGroup):
            raise PipelineBroadcastError(f"broadcast on a group the PP stand-in did not make: {group!r}")
        if group.rank == src:
            self.queued.append(tensor.detach().clone())
            self.sent += 1
            return None
        if not self.queued:
            error = PipelineBroadcastError(
                f"PP rank {group.rank} receives a broadcast the last rank never sent this step")
            error.add_note(f"receives {tuple(tensor.shape)} {tensor.dtype}")
            raise error
        sent = self.queued.popleft()
        if tuple(sent.shape) != tuple(tensor.shape) or sent.dtype != tensor.dtype:
            # one message for every shape (a known finding's signature); the shapes in a note
            error = PipelineBroadcastError(
                f"PP rank {group.rank} receives a broadcast of another shape or dtype than the last "
                f"rank sent (the ranks broadcast for different batches)")
            error.add_note(f"received {tuple(tensor.shape)} {tensor.dtype}, sent "
                           f"{tuple(sent.shape)} {sent.dtype}")
            raise error
        tensor.copy_(sent)
        self.received += 1
        return None

    def clear(self) -> int:
        """Forget what no rank received; returns how many were left."""
        left = len(self.queued)
        self.queued.clear()
        self.sent = self.received = 0
        return left


@contextlib.contextmanager
def collectives(mailbox: BroadcastMailbox | None) -> Iterator[None]:
    """The PP broadcast through ``mailbox`` for the length of one call (a
    rank's ``sample_tokens``); on CPU, ``record_stream`` of the stream
    stand-ins is a no-op as every other stream call is. Nothing without PP."""
    if mailbox is None:
        yield
        return
    import torch  # lazy: torch loads only when this runs

    patches: list[tuple[Any, str, Any]] = [(torch.distributed, "broadcast", mailbox.broadcast)]
    if platform.current() is not None and platform.current().is_cpu:
        patches.append((torch.Tensor, "record_stream", lambda self, stream: None))
    with platform.streams_without_cuda(), platform.patched(patches):
        yield


def pp_handler(rank: int, world_size: int, mailbox: BroadcastMailbox, *, max_num_reqs: int,
               num_speculative_steps: int, device: Any) -> Any:
    """vLLM's own ``PPHandler`` for ``rank``, built by its ``__init__`` with the
    group stand-in in place of ``get_pp_group()``."""
    from vllm.v1.worker.gpu import pp_utils  # lazy: vllm loads after platform.configure() sets its env

    group = PipelineGroupStandIn(rank, world_size, mailbox)
    with platform.streams_without_cuda(), platform.patched([(pp_utils, "get_pp_group", lambda: group)]):
        return pp_utils.PPHandler(max_num_reqs=max_num_reqs,
                                  num_speculative_steps=num_speculative_steps, device=device)
