"""The vLLM-agnostic step model: what a scheduler tells the runner in one step.

A ``Step`` mirrors the information content of vLLM's ``SchedulerOutput`` that
reaches the MRV2 input path, in plain Python types, so traces survive vLLM
upgrades. ``simrig.adapters.runner`` is the one place that maps it to the installed
version's classes.

    step k:  finished/preempted ids --> runner frees their slots
             new requests           --> runner adds state (prefill tokens)
             cached updates         --> runner refreshes num_computed_tokens
             num_scheduled_tokens   --> the batch (decode / extend / prefill)
             spec_tokens            --> draft token count per request
             rejected               --> sampler outcome (drafts rejected)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace

from simrig.sampling.params import SamplingSpec

# Synthesised token ids stay inside a small vocabulary: every id fits the
# runner's int32 token table with room to spare, and the stand-in logits (one
# vocabulary-wide row per logit index, see adapters/sampling.py) and the greedy
# samplers' argmax over them stay cheap. At 32,000 they were ~9 % of a campaign.
SYNTH_VOCAB_SIZE = 4_096


def synth_token(req_id: str, position: int) -> int:
    """The deterministic token id at ``position`` of request ``req_id``.

    Prompt tokens, sampled tokens and draft tokens all use this one function,
    so a trace that carries only lengths still has one well-defined token at
    every position, and an independent model can predict ``input_ids``.
    """
    seed = zlib.crc32(req_id.encode())
    return (seed * 31 + position * 2_654_435_761) % SYNTH_VOCAB_SIZE


def draft_token(req_id: str, position: int, rejected: bool) -> int:
    """The drafter stand-in's proposal for ``position``.

    A draft the sampler will accept is the target's own token there; a draft
    it will reject is a different token, so a rejection shows in the values
    (the rejected draft sits in this step's input_ids; the next step's input
    at that position must be the target's token again)::

        position      n     n+1   n+2   n+3        (k = 3 drafts, 1 rejected)
        input_ids     t(n)  t(n+1) t(n+2) t'(n+3)  t = synth_token, t' = t + 1
    """
    token = synth_token(req_id, position)
    return (token + 1) % SYNTH_VOCAB_SIZE if rejected else token


def rejected_from(step: "Step", req_id: str) -> int:
    """Index of the first rejected draft of ``req_id`` this step (drafts past it are rejected)."""
    drafts = step.spec_tokens.get(req_id, 0)
    return drafts - min(step.rejected.get(req_id, 0), drafts)


# vLLM's CUDAGraphMode names; the two with a separate decode routine run
# decode batches on FULL graphs of their own (CUDAGraphMode.separate_routine).
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
SEPARATE_DECODE_MODES = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


KV_GROUP_KINDS = ("full", "sliding_window")

# The rejection sampler a spec-decode runner verifies drafts with: "" the greedy
# stand-in (adapters/sampling.py); else vLLM's own RejectionSampler under that
# SpeculativeConfig.rejection_sample_method ("standard": Leviathan et al.;
# "block": block verification, Sun et al.), every release 0.30-0.33 has both.
REJECTION_SAMPLERS = ("", "standard", "block")


@dataclass(frozen=True)
class KvGroup:
    """One KV cache group: full attention, or a sliding window (vLLM's
    FullAttentionSpec / SlidingWindowSpec)."""

    kind: str = "full"  # one of KV_GROUP_KINDS
    window: int = 0  # sliding_window: tokens a query attends, itself included
    block_size: int = 0  # tokens per block; 0: the config's block_size


@dataclass(frozen=True)
class RunnerConfig:
    """The runner-side limits a trace was produced under."""

    max_num_reqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    num_speculative_tokens: int = 0
    pcp_size: int = 1
    dcp_size: int = 1
    shard_decode_requests: bool = False
    block_size: int = 16
    # CUDA-graph dispatch (vLLM's CompilationConfig.cudagraph_mode and
    # cudagraph_capture_sizes): each step replays the graph vLLM's own
    # dispatcher picks, padded to its shape. () with a graph mode: the sizes
    # vLLM's own config derives (simrig.vllm_parts.vllm_config).
    cudagraph_mode: str = "NONE"
    capture_sizes: tuple[int, ...] = ()
    # Decode graphs that take any mix of 1..decode_query_len tokens per
    # request instead of exactly decode_query_len (separate-routine modes).
    varlen_decode: bool = False
    # LoRA (vLLM's LoRAConfig.max_loras: "Max number of LoRAs in a single
    # batch"); 0 runs without LoRA (no LoRAConfig). The two switches pick which
    # active-adapter counts get graphs of their own: LoRAConfig.
    # specialize_active_lora and CompilationConfig.cudagraph_specialize_lora.
    max_loras: int = 0
    specialize_active_lora: bool = False
    cudagraph_specialize_lora: bool = True
    # The KV cache groups, in group order (default: one full-attention group).
    kv_groups: tuple[KvGroup, ...] = (KvGroup(),)
    # See REJECTION_SAMPLERS; only with num_speculative_tokens > 0.
    rejection_sampler: str = ""
    # Pipeline parallel world size (vLLM's ParallelConfig.pipeline_parallel_size):
    # > 1 drives a non-last PP rank's runner next to the last rank's (adapters/pp_peer.py).
    pp_size: int = 1
    # Micro-batching (DBO: vLLM's ParallelConfig.enable_dbo for 2, ubatch_size for
    # more; 1 is off) and the token counts from which a batch is split:
    # dbo_decode_token_threshold "for batches only containing decodes",
    # dbo_prefill_token_threshold "for batches that contain one or more prefills".
    num_ubatches: int = 1
    dbo_decode_token_threshold: int = 32
    dbo_prefill_token_threshold: int = 512

    def group_block_size(self, group: int) -> int:
        """Tokens per block of KV cache group ``group``."""
        return self.kv_groups[group].block_size or self.block_size

    @property
    def num_kv_groups(self) -> int:
        return len(self.kv_groups)

    def blocks_per_request(self, group: int = 0) -> int:
        """Block-table row width of KV cache group ``group``: every position up to
        max_model_len (a sliding-window row keeps the null entries of the blocks
        it skipped)."""
        return -(-self.max_model_len // self.group_block_size(group))

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the KV cache the runner is built with: every request slot at
        the longest model length in every group, plus the null block 0. Valid
        block ids are 0 .. num_kv_blocks - 1 (the adapter's KVCacheConfig and the
        trace reader's bound both read it here)."""
        return self.max_num_reqs * sum(self.blocks_per_request(g) for g in range(self.num_kv_groups)) + 1

    @property
    def decode_query_len(self) -> int:
        return 1 + self.num_speculative_tokens

    @property
    def graph_capture_sizes(self) -> tuple[int, ...]:
        """The capture sizes the trace names, sorted and deduplicated; () in eager
        mode or when it names none. vLLM's own config code turns these (or, when
        there are none, its default list) into the sizes the runner uses; the
        harness records those on each dispatch and the oracle reads them there."""
        if self.cudagraph_mode == "NONE":
            return ()
        return tuple(sorted(set(self.capture_sizes)))

    def replayed_as(self, pcp_size: int, cudagraph_mode: str | None = None) -> RunnerConfig:
        """This config replayed at another PCP size and, unless None, under another
        cudagraph mode: the capture sizes stay, varlen decode only where the mode
        has a decode routine."""
        if cudagraph_mode is None or cudagraph_mode == self.cudagraph_mode:
            return replace(self, pcp_size=pcp_size)
        return replace(self, pcp_size=pcp_size, cudagraph_mode=cudagraph_mode,
                       varlen_decode=self.varlen_decode and cudagraph_mode in SEPARATE_DECODE_MODES)

    def validate(self) -> None:
        for name in ("max_num_reqs", "max_num_batched_tokens", "max_model_len",
                     "pcp_size", "dcp_size", "block_size", "pp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        nst = self.num_speculative_tokens
        if not isinstance(nst, int) or isinstance(nst, bool) or nst < 0:
            raise ValueError(f"num_speculative_tokens: must be >= 0, got {nst!r}")
        # vLLM shards decodes across PCP ranks only without DCP: DCP shards the
        # KV cache, so every decode must run on every DCP rank
        # (ParallelConfig.pcp_shard_decode_requests).
        if self.shard_decode_requests and self.dcp_size > 1:
            raise ValueError(f"shard_decode_requests: requires dcp_size 1, got dcp_size {self.dcp_size}")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph_mode: must be one of {', '.join(CUDAGRAPH_MODES)}, "
                             f"got {self.cudagraph_mode!r}")
        for size in self.capture_sizes:
            if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= self.max_num_batched_tokens:
                raise ValueError(f"capture_sizes: each must be an integer in [1, max_num_batched_tokens="
                                 f"{self.max_num_batched_tokens}], got {size!r}")
        # PCPManager.validate_config: "MRV2 PCP supports full CUDA graphs for
        # decode-only routines" (FULL without a separate decode routine is refused).
        if self.pcp_size > 1 and self.cudagraph_mode == "FULL":
            raise ValueError("cudagraph_mode: FULL is refused with PCP > 1 (use FULL_DECODE_ONLY, "
                             "FULL_AND_PIECEWISE, PIECEWISE or NONE)")
        self._validate_kv_groups()
        if self.varlen_decode and self.cudagraph_mode not in SEPARATE_DECODE_MODES:
            raise ValueError(f"varlen_decode: needs a mode with a separate decode routine "
                             f"({', '.join(SEPARATE_DECODE_MODES)}), got {self.cudagraph_mode}")
        if not isinstance(self.max_loras, int) or isinstance(self.max_loras, bool) or self.max_loras < 0:
            raise ValueError(f"max_loras: must be >= 0 (0: no LoRA), got {self.max_loras!r}")
        if self.rejection_sampler not in REJECTION_SAMPLERS:
            raise ValueError(f"rejection_sampler: must be one of {', '.join(map(repr, REJECTION_SAMPLERS))}, "
                             f"got {self.rejection_sampler!r}")
        if self.rejection_sampler and nst == 0:
            raise ValueError("rejection_sampler: needs num_speculative_tokens > 0")
        self._validate_ubatches()

    def _validate_ubatches(self) -> None:
        n = self.num_ubatches
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"num_ubatches: must be a positive integer (1: off), got {n!r}")
        for name in ("dbo_decode_token_threshold", "dbo_prefill_token_threshold"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: must be a non-negative integer, got {value!r}")
            # ParallelConfig: "dbo_decode_token_threshold and dbo_prefill_token_threshold
            # must be at least the number of microbatches"
            if n > 1 and value < n:
                raise ValueError(f"{name}: must be at least num_ubatches ({n}), got {value}")
        # VllmConfig._get_dbo_unsupported_features: "dual batch overlap with LoRA",
        # "... with speculative decoding", "... with context parallelism", "... with
        # PIECEWISE CUDA graphs", "... with pipeline parallelism" (0.30.0-0.33.0).
        if n > 1:
            refused = [what for what, on in (
                ("LoRA", self.max_loras > 0), ("speculative decoding", self.num_speculative_tokens > 0),
                ("context parallelism", self.pcp_size > 1 or self.dcp_size > 1),
                ("pipeline parallelism", self.pp_size > 1),
                ("PIECEWISE CUDA graphs", self.cudagraph_mode == "PIECEWISE")) if on]
            if refused:
                raise ValueError(f"num_ubatches: vLLM refuses dual batch overlap with {refused[0]}")

    def _validate_kv_groups(self) -> None:
        if not isinstance(self.kv_groups, tuple) or not self.kv_groups:
            raise ValueError(f"kv_groups: must name at least one group, got {self.kv_groups!r}")
        for i, group in enumerate(self.kv_groups):
            if group.kind not in KV_GROUP_KINDS:
                raise ValueError(f"kv_groups[{i}].kind: must be one of {', '.join(KV_GROUP_KINDS)}, "
                                 f"got {group.kind!r}")
            for name in ("window", "block_size"):
                value = getattr(group, name)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"kv_groups[{i}].{name}: must be a non-negative integer, got {value!r}")
            if group.kind == "full" and group.window:
                raise ValueError(f"kv_groups[{i}].window: only a sliding_window group has one")
            if group.kind == "sliding_window":
                if group.window < 1:
                    raise ValueError(f"kv_groups[{i}].window: a sliding_window group needs a "
                                     f"window >= 1, got {group.window}")
                # SlidingWindowManager.find_longest_cache_hit: "DCP not support
                # sliding window attn now." / "PCP not support sliding window attn now."
                if self.pcp_size > 1 or self.dcp_size > 1:
                    raise ValueError(f"kv_groups[{i}].kind: vLLM supports sliding_window groups only "
                                     f"without PCP and DCP (pcp_size {self.pcp_size}, dcp_size {self.dcp_size})")


# A request's block ids in a Step: one list of ids for a one-group config (the
# form every one-group trace uses), else one list per KV cache group.
BlockIds = list


def block_groups(block_ids: BlockIds | None, num_groups: int = 1) -> list[list[int]]:
    """``block_ids`` as one list per group: a flat list is group 0's."""
    if block_ids and isinstance(block_ids[0], list):
        return [list(group) for group in block_ids]
    return [list(block_ids or [])] + [[] for _ in range(num_groups - 1)]


def step_block_ids(groups: list[list[int]]) -> BlockIds:
    """Per-group lists in the Step form: flat for one group."""
    return list(groups[0]) if len(groups) == 1 else [list(g) for g in groups]


@dataclass
class NewRequest:
    """A request the runner sees for the first time (or again, after preemption), or
    a streaming-input update of a request the runner still holds (``streaming``)."""

    req_id: str
    prompt_len: int
    num_computed_tokens: int = 0
    max_tokens: int = 16
    # Tokens handed to the runner; > prompt_len when resuming with outputs.
    prefill_len: int | None = None
    # Explicit prompt token ids; None means synthesise with synth_token.
    prompt_token_ids: list[int] | None = None
    block_ids: BlockIds = field(default_factory=list)  # see block_groups
    # The request's LoRA adapter (LoRARequest.lora_int_id, >= 1); None: the base model.
    lora_id: int | None = None
    # A streaming-input update (vLLM's resumable requests): the id is still held by
    # the runner, which removes its state and re-adds it (GPUModelRunner.add_requests:
    # "Streaming input update: request already exists from a prior chunk. Remove old
    # state so it can be cleanly re-added"). The prompt is the session's tokens so far
    # (the last sampled one dropped) plus the new input; num_computed_tokens the
    # session's computed frontier; block_ids every block it holds.
    streaming: bool = False
    # The request's sampling parameters; None: vLLM's defaults. A request re-sent (resumed
    # after preemption, or a streaming update) carries them again.
    sampling: SamplingSpec | None = None
    # A structured-output request (vLLM: SamplingParams.structured_outputs set): its grammar
    # lives in the scheduler, which states the tokens it allows each step (``Step.grammar``);
    # its rows sample through vLLM's sampler, as a request with parameters does
    structured_output: bool = False
    # The outputs a resumed request re-sends where they are the sampler's (its rows spread):
    # set by the harness, as a scheduler re-sends what it was given; never in a trace
    output_token_ids: list[int] | None = None

    @property
    def num_prefill_tokens(self) -> int:
        return self.prompt_len if self.prefill_len is None else self.prefill_len

    def prefill_token_ids(self) -> list[int]:
        """All tokens passed to the runner: prompt, then earlier outputs."""
        n = self.num_prefill_tokens
        if self.prompt_token_ids is not None:
            head = list(self.prompt_token_ids)
        else:
            head = [synth_token(self.req_id, p) for p in range(self.prompt_len)]
        given = self.output_token_ids or []
        return head + [given[p - len(head)] if p - len(head) < len(given) else synth_token(self.req_id, p)
                       for p in range(len(head), n)]


@dataclass
class CachedUpdate:
    """A request the runner already holds, scheduled again."""

    req_id: str
    num_computed_tokens: int
    new_block_ids: BlockIds | None = None  # see block_groups
    resumed: bool = False


@dataclass
class Step:
    """One scheduler step, in the order the runner consumes it."""

    new_requests: list[NewRequest] = field(default_factory=list)
    cached: list[CachedUpdate] = field(default_factory=list)
    # req_id -> tokens scheduled this step (including draft tokens)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    # req_id -> number of draft tokens scheduled (their ids come from the
    # runner's own drafter; the scheduler only forwards placeholders)
    spec_tokens: dict[str, int] = field(default_factory=dict)
    # req_id -> number of draft tokens the sampler rejected this step
    rejected: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    # False: the rank goes straight on to its next batch, with no idle dummy
    # (``_dummy_run``) after this step; the next step's gather then meets the
    # shared tables as this one left them
    idle_dummy: bool = True
    # The grammar bitmask the scheduler sends (vLLM's GrammarOutput): structured-output request
    # -> the token ids its grammar allows on its logit row this step (ascending), in the order
    # the scheduler lists them (GrammarOutput.structured_output_request_ids)
    grammar: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def req_ids(self) -> list[str]:
        """Scheduled request ids, in the scheduler's order."""
        return list(self.num_scheduled_tokens)

    def placeholder_drafts(self) -> set[str]:
        """Requests whose drafts this step the scheduler made up: sent as new (a P/D remote KV
        load, a resume with all but one token cached), no drafter has proposed for them; vLLM's
        scheduler pads them with -1 ("Pad new decode requests to uniform spec decoding size")."""
        return {r.req_id for r in self.new_requests if self.spec_tokens.get(r.req_id, 0) > 0}

    def num_accepted(self, req_id: str) -> int:
        """Tokens of ``req_id`` that count as computed once this step is done.

        The continuity rule, in one place: a request's computed tokens after
        step k are those before it plus what step k scheduled minus the draft
        tokens the sampler rejected, where rejections never exceed the drafts
        scheduled. The next cached update must carry exactly that count::

            computed(k+1) = computed(k) + scheduled(k) - min(rejected(k), drafts(k))
        """
        drafts = self.spec_tokens.get(req_id, 0)
        return self.num_scheduled_tokens.get(req_id, 0) - min(self.rejected.get(req_id, 0), drafts)
