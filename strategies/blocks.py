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

Each KV cache group has its own manager (kv_cache_coordinator: one
SingleTypeKVCacheManager per group) over the one shared pool: a step allocates
group by group, in group order. A sliding-window group of window W also follows
SlidingWindowManager (single_type_kv_cache_manager.py):

    skipped tokens after c computed:     get_num_skipped_tokens: "the tokens that are prior
      max(0, c - W + 1)                  to the current sliding window" (c - W + 1)
    a running request's skipped blocks   remove_skipped_blocks (run from allocate_slots
      are freed before it grows, tail      before the allocation): "Remove and free blocks
      first, and become null (id 0) in     no longer needed ... replaced by null_block";
      the scheduler's list only            _remove_blocks_in_range iterates backward
      (the runner is not told)
    a prefix hit's skipped blocks are    add_local_computed_blocks: "Skip blocks are padded
      null in the list sent as new         with null blocks"
    finish / preemption frees the        pop_blocks_for_free: "without the leading null
      non-null blocks, tail first          blocks"

The strategies model no token contents, so a prefix-cache hit shares the
leading blocks of a live request that holds enough of them (the donor), and
takes fresh blocks when none does (a hit on blocks cached but no longer held).

The pool is sized so it never runs out: at most ``max_num_reqs`` requests hold
blocks when a step allocates (finished and preempted ones are released first),
each at most ``ceil(max_model_len / tokens_per_block)`` per group.
"""

from __future__ import annotations

from collections import deque

from simrig.step import BlockIds, RunnerConfig, step_block_ids

NULL_BLOCK_ID = 0  # vllm.v1.attention.backends.utils.NULL_BLOCK_ID


def tokens_per_block(config: RunnerConfig, group: int = 0) -> int:
    """Tokens one scheduler block of ``group`` covers: its block size, times the DCP size under DCP."""
    return config.group_block_size(group) * config.dcp_size


def blocks_for(num_tokens: int, config: RunnerConfig, group: int = 0) -> int:
    """Blocks of ``group`` a request needs to hold the KV of ``num_tokens`` tokens."""
    per_block = tokens_per_block(config, group)
    return -(-num_tokens // per_block)


def skipped_blocks(config: RunnerConfig, group: int, num_computed: int) -> int:
    """Leading blocks of ``group`` wholly below the sliding window after
    ``num_computed`` computed tokens (0 for full attention)."""
    spec = config.kv_groups[group]
    if spec.kind != "sliding_window":
        return 0
    return max(0, num_computed - spec.window + 1) // tokens_per_block(config, group)


class BlockPool:
    """Block ids per request and group, with reference counts and one LIFO free queue.

    Methods return block ids in the Step form (``simrig.step.block_groups``):
    one flat list for a one-group config, else one list per group.
    """

    def __init__(self, config: RunnerConfig):
        self.config = config
        self.groups = range(config.num_kv_groups)
        per_request = sum(blocks_for(config.max_model_len, config, g) for g in self.groups)
        self.num_blocks = 1 + config.max_num_reqs * per_request  # + the null block
        self.free_queue: deque[int] = deque(range(1, self.num_blocks))
        self.ref_count: dict[int, int] = {}
        # req_id -> one block list per group, in order (NULL_BLOCK_ID: skipped)
        self.held: dict[str, list[list[int]]] = {}

    # ------------------------------------------------------------ queries
    def blocks_of(self, req_id: str) -> BlockIds:
        return step_block_ids(self.held.get(req_id) or [[] for _ in self.groups])

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

    def _free(self, blocks: list[int]) -> None:
        """Drop one reference of each block, in the order given; the blocks no one
        holds go to the queue front in that order (the first is reused first)."""
        freed = []
        for block in blocks:
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                del self.ref_count[block]
                freed.append(block)
        self.free_queue.extendleft(reversed(freed))

    def admit(self, req_id: str, num_tokens: int, prefix_hit_tokens: int = 0) -> BlockIds:
        """A request sent as new (first arrival or resume): its full block lists,
        covering ``num_tokens``; the blocks of a prefix hit are shared with a live
        request holding them, else fresh; a sliding-window group's blocks below
        the window of the hit are null."""
        assert req_id not in self.held, f"{req_id} already holds blocks"
        rows = []
        for g in self.groups:
            shared_count = prefix_hit_tokens // tokens_per_block(self.config, g)
            skip = skipped_blocks(self.config, g, prefix_hit_tokens)
            donor = next((held[g] for held in self.held.values() if len(held[g]) >= shared_count
                          and NULL_BLOCK_ID not in held[g][skip:shared_count]), None)
            if shared_count > skip and donor is not None:
                shared = donor[skip:shared_count]
                for block in shared:
                    self.ref_count[block] += 1
            else:
                shared = self._take(shared_count - skip)
            fresh = self._take(max(0, blocks_for(num_tokens, self.config, g) - shared_count))
            rows.append([NULL_BLOCK_ID] * skip + shared + fresh)
        self.held[req_id] = rows
        return self.blocks_of(req_id)

    def grow(self, req_id: str, num_tokens: int, num_computed: int = 0) -> BlockIds:
        """Blocks appended so ``req_id`` covers ``num_tokens`` (never shrinks: a
        rejected draft's block stays allocated), after a sliding-window group
        frees the blocks wholly below the window of ``num_computed`` tokens."""
        rows = self.held[req_id]
        for g in self.groups:
            self._drop_skipped(rows[g], skipped_blocks(self.config, g, num_computed))
        new = []
        for g in self.groups:
            added = self._take(max(0, blocks_for(num_tokens, self.config, g) - len(rows[g])))
            rows[g].extend(added)
            new.append(added)
        return step_block_ids(new)

    def _drop_skipped(self, row: list[int], skip: int) -> None:
        """Free row[:skip] from the back, stopping at the first null (freed earlier)."""
        freed = []
        for i in range(min(skip, len(row)) - 1, -1, -1):
            if row[i] == NULL_BLOCK_ID:
                break
            freed.append(row[i])
            row[i] = NULL_BLOCK_ID
        self._free(freed)

    def release(self, req_id: str) -> None:
        """Finish or preemption: group by group, tail first; a block is free once
        no request holds it."""
        for row in self.held.pop(req_id, []):
            self._free([b for b in reversed(row) if b != NULL_BLOCK_ID])
