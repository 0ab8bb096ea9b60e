"""A block pool the strategies allocate KV-cache block ids from, as vLLM's scheduler does.

What it models, and where vLLM says so (vLLM 0.33.0, vllm/v1/core/):

    block 0 is never handed out          block_pool.BlockPool.__init__: "To represent a
                                         placeholder block with block_id=0" (the null block,
                                         popped off the free queue first and never freed)
    fresh ids come off the queue front   FreeKVCacheBlockQueue: "The queue is ordered by block
                                         ID in the beginning"; get_new_blocks pops the front
    a block spans block_size * dcp       kv_cache_utils.resolve_dcp_kv_block_size: "Return
      tokens of the sequence             the token span of a cache block under DCP"
                                         (SingleTypeKVCacheManager: block_size * dcp_world_size)
    freed tail first, reused first       SingleTypeKVCacheManager.free: "Free blocks in reverse
      (LIFO)                             order so that the tail blocks are freed first";
                                         BlockPool.free_blocks: "LIFO reuse of non-cached
                                         blocks", "prepended to the front of the free queue"
    prefix-hit blocks are shared         a hit takes the cached blocks by reference (ref_cnt);
                                         a block returns to the queue when its last holder frees it

The strategies model no token contents, so a prefix-cache hit shares the
leading blocks of a live request that holds enough of them (the donor), and
takes fresh blocks when none does (a hit on blocks cached but no longer held).

The pool is sized so it never runs out: at most ``max_num_reqs`` requests hold
blocks when a step allocates (finished and preempted ones are released first),
each at most ``ceil(max_model_len / tokens_per_block)``.
"""

from __future__ import annotations

from collections import deque

from simrig.step import RunnerConfig

NULL_BLOCK_ID = 0  # vllm.v1.attention.backends.utils.NULL_BLOCK_ID


def tokens_per_block(config: RunnerConfig) -> int:
    """Tokens one scheduler block covers: block_size, times the DCP size under DCP."""
    return config.block_size * config.dcp_size


def blocks_for(num_tokens: int, config: RunnerConfig) -> int:
    """Blocks a request needs to hold the KV of ``num_tokens`` tokens."""
    per_block = tokens_per_block(config)
    return -(-num_tokens // per_block)


class BlockPool:
    """Block ids per request, with reference counts and a LIFO free queue."""

    def __init__(self, config: RunnerConfig):
        self.config = config
        max_per_request = blocks_for(config.max_model_len, config)
        self.num_blocks = 1 + config.max_num_reqs * max_per_request  # + the null block
        self.free_queue: deque[int] = deque(range(1, self.num_blocks))
        self.ref_count: dict[int, int] = {}
        self.held: dict[str, list[int]] = {}  # req_id -> its block list, in order

    # ------------------------------------------------------------ queries
    def blocks_of(self, req_id: str) -> list[int]:
        return list(self.held.get(req_id, ()))

    def is_shared(self, block_id: int) -> bool:
        return self.ref_count.get(block_id, 0) > 1

    # ------------------------------------------------------------ changes
    def _take(self, count: int) -> list[int]:
        if count > len(self.free_queue):
            raise RuntimeError(f"block pool of {self.num_blocks} ran out: {count} wanted, "
                               f"{len(self.free_queue)} free")
        taken = [self.free_queue.popleft() for _ in range(count)]
        for block in taken:
            self.ref_count[block] = 1
        return taken

    def admit(self, req_id: str, num_tokens: int, prefix_hit_tokens: int = 0) -> list[int]:
        """A request sent as new (first arrival or resume): its full block list,
        covering ``num_tokens``; the blocks of a prefix hit are shared with a live
        request holding that many, else fresh."""
        assert req_id not in self.held, f"{req_id} already holds blocks"
        shared_count = prefix_hit_tokens // tokens_per_block(self.config)
        donor = next((blocks for blocks in self.held.values() if len(blocks) >= shared_count), None)
        if shared_count and donor is not None:
            shared = donor[:shared_count]
            for block in shared:
                self.ref_count[block] += 1
        else:
            shared = self._take(shared_count)
        self.held[req_id] = shared + self._take(max(0, blocks_for(num_tokens, self.config) - shared_count))
        return list(self.held[req_id])

    def grow(self, req_id: str, num_tokens: int) -> list[int]:
        """Blocks appended so ``req_id`` covers ``num_tokens`` (never shrinks: a
        rejected draft's block stays allocated)."""
        blocks = self.held[req_id]
        new = self._take(max(0, blocks_for(num_tokens, self.config) - len(blocks)))
        blocks.extend(new)
        return new

    def release(self, req_id: str) -> None:
        """Finish or preemption: tail first; a block is free once no request holds it."""
        freed = []
        for block in reversed(self.held.pop(req_id, [])):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                del self.ref_count[block]
                freed.append(block)
        # prepend_n keeps the list's order: the tail block ends up in front,
        # so it is the first one reused.
        self.free_queue.extendleft(reversed(freed))
