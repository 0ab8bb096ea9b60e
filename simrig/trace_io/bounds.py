"""Input bounded before vLLM runs: every size in a trace against its own config,
and the config against the machine.

``check_config`` holds the header's config to the memory this process can have
(``estimate_bytes``), to the time a runner may take to start and step (``estimate_seconds``)
and to int32; ``StepBounds`` holds every size to what the runner's buffers were built for
(its docstring tables the rules), adversarial traces too. Each problem is a
``TraceError`` raised while the file is read, so ``simrig replay`` refuses the input
before vLLM is imported. The format's spec (traces/README.md, *Bounds*) lists the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

# MEMORY_ENV and parse_byte_count: the reader's callers and tests reach them here too
from simrig.host_memory import MEMORY_ENV, available_memory, format_bytes, parse_byte_count  # noqa: F401
from simrig.step import SYNTH_VOCAB_SIZE, BlockIds, NewRequest, RunnerConfig, Step, block_groups
from simrig.trace_io.trace_format import _Line

INT32_MAX = 2**31 - 1
HEADER_LINE_BYTES = 4 << 20  # the header's longest line (config, source, expect)
MAX_SECONDS = 60  # a config's start-up and first full step: a tenth of --step-timeout's default

# Per token slot (max_num_reqs x max_model_len): the token table's int32 (RequestState.
# all_token_ids) is a tensor; the rest is Python: the reference model's token list, the
# SchedulerOutput's prefill_token_ids handed to the runner, and a step line's text and
# parsed ids when the trace carries them (about 36 bytes per Python int held, each time).
_PYTHON_BYTES_PER_SLOT = 128
_FIXED_PER_GROUP = 48 << 10  # a KV cache group's specs, layer names, metadata builder, pointers
_FIXED_PER_MANAGER = 64 << 10  # one PCPManager's own objects
_FIXED_PER_GRAPH = 24 << 10  # one captured graph's descriptor and buffers
_FIXED_PARALLEL = 48 << 20  # the modules PP or PCP load on first use (265 of them, about 30 MB)


# ------------------------------------------------------------------ the config
def max_line_bytes(config: RunnerConfig) -> int:
    """The longest step line a trace of ``config`` may hold: every request slot
    sent as new at once, each with max_model_len explicit token ids and a full
    block-table row (12 bytes a number, ``2147483647,`` and a space) and a ``grammar``
    list of every token of the vocabulary, plus room for ids, maps and the requests'
    ``sampling`` objects (their lists are held to the MRV2 sampler's own limits, a few tens
    of KB at most, by ``simrig.sampling.params``)."""
    per_request = (config.max_model_len + _row_blocks(config)) * 12 + SYNTH_VOCAB_SIZE * 6 + (4 << 10)
    return (1 << 20) + config.max_num_reqs * per_request


def _row_blocks(config: RunnerConfig) -> int:
    return sum(config.blocks_per_request(g) for g in range(config.num_kv_groups))


def _lora_cases(config: RunnerConfig) -> int:
    """How many active-adapter counts get graphs, at most: vLLM's get_lora_capture_cases
    (v1/worker/gpu/lora_utils.py:20-35) over get_captured_lora_counts (lora/utils.py:55-69):
    [0] without LoRA, [0, max_loras + 1] unspecialized, else 0, the powers of 2 up to
    max_loras + 1 and max_loras + 1 itself."""
    n = config.max_loras
    if n <= 0:
        return 1
    specialized = config.cudagraph_specialize_lora and config.specialize_active_lora
    return 2 + (n + 1).bit_length() if specialized else 2


def _shapes(config: RunnerConfig) -> tuple[int, int]:
    """(shapes captured, each once per LoRA case; entries of the dispatcher's candidate map),
    at most: every capture size in the two runtime modes (x 2 with micro-batch twins), and
    CudaGraphManager._init_candidates' entry per token count up to the largest size, LoRA
    case and mode (v1/worker/gpu/cudagraph_utils.py:305, 380-396). Without sizes named,
    vLLM's default list (VllmConfig._set_cudagraph_sizes, config/vllm.py:2453-2604: 1, 2, 4,
    multiples of 8 to 256 and of 16 up to 2 x max_num_reqs x decode_query_len, at most 1024)
    and as many decode sizes."""
    if config.cudagraph_mode == "NONE":
        return 0, 0
    sizes = config.capture_sizes
    cap = min(config.max_num_batched_tokens, 2 * config.max_num_reqs * config.decode_query_len, 1024)
    grid = sum(x <= cap for x in (1, 2, 4)) + min(cap, 255) // 8 + max(0, (cap - 240) // 16)
    shapes = (len(set(sizes)) if sizes else 2 * grid + 1) * 2 * (2 if config.num_ubatches > 1 else 1)
    return shapes, (max(sizes, default=cap) + 1) * 2 * _lora_cases(config)


def estimate_bytes(config: RunnerConfig) -> int:
    """About what replaying ``config`` allocates, at most (vLLM 0.33's MRV2
    buffers, read off vllm/v1/worker/gpu/, and the rig's own), in bytes. A PP config
    builds each runner's part twice (adapters/pp_peer.py: the non-last rank's runner).
    The runners' part counts twice: the harness keeps a copy of the state after
    start-up to put back between examples (adapters/reuse.py)."""
    reqs, tokens = config.max_num_reqs, config.max_num_batched_tokens
    slots = reqs * config.max_model_len
    groups, rows = config.num_kv_groups, _row_blocks(config)
    pcp, loras = config.pcp_size, config.max_loras
    managers = pcp * config.dcp_size if pcp > 1 else 0  # PCPManager per PCP rank and DCP peer
    query = config.decode_query_len
    runners = 2 if config.pp_size > 1 else 1
    shapes, candidates = _shapes(config)
    runner = (slots * 4                            # RequestState.all_token_ids [reqs, max_model_len] int32
              + reqs * rows * 4 * 2                # BlockTables: block_tables + input_block_tables, int32
              + managers * reqs * rows * 4         # each PCP manager's local block tables
              + groups * tokens * 8                # BlockTables.slot_mappings [groups, tokens] int64
              + managers * groups * tokens * 8 * (1 + pcp)  # PCP global + gathered slot mappings
              + tokens * (4 + 8 + 1)               # InputBuffers
              + reqs * query * 8 + reqs * 128      # draft tokens; per-request vectors (lengths, LoRA..)
              # CudaGraphManager._candidates (a key, a list, an entry) and _lora_dispatch_map (an
              # entry a count: v1/worker/gpu/cudagraph_utils.py:203-220)
              + candidates * 384 + loras * 256
              + groups * _FIXED_PER_GROUP + managers * _FIXED_PER_MANAGER
              + shapes * _lora_cases(config) * _FIXED_PER_GRAPH)
    rig = (tokens * 13 + reqs * query * 8          # the dummy runs' InputBuffers; the drafter stand-in's rows
           + min(tokens, reqs * query) * SYNTH_VOCAB_SIZE * 4 * 2)  # stand-in logits + a copy
    ubatches = config.num_ubatches if 1 < config.num_ubatches <= tokens else 0  # a split batch's slices
    transient = (tokens * 48 + ubatches * 4096     # the profile run's hidden states and batch; the slices
                 # a dummy run's warm-up adapters: two sets of max_loras LoRARequests and the ids
                 # listed (v1/worker/lora_model_runner_mixin.py:131-138, 216-219, 239-246)
                 + loras * 768
                 # the PP group stand-in's ranks and PPHandler's ring of pp_size entries, per runner
                 # (vllm_parts/pipeline.py; v1/worker/gpu/pp_utils.py:81-85)
                 + (config.pp_size * 64 * runners if runners > 1 else 0))
    parallel = _FIXED_PARALLEL if runners > 1 or pcp > 1 else 0
    return 2 * (runners * runner + rig) + slots * _PYTHON_BYTES_PER_SLOT + transient + parallel


def estimate_seconds(config: RunnerConfig) -> float:
    """About how long the runner takes to start (profile run, captures, dispatcher) and
    run one full step of ``config``, in seconds, where it grows with a config size: each
    term measured with vLLM 0.33 on a 2-core CPU running MRV2's kernels in Triton's
    interpreter (a GPU is faster). Every runner of a PP config starts and steps."""
    tokens, loras = config.max_num_batched_tokens, config.max_loras
    shapes, candidates = _shapes(config)
    managers = config.pcp_size * config.dcp_size if config.pcp_size > 1 else 0
    ubatches = config.num_ubatches if 1 < config.num_ubatches <= tokens else 0  # as estimate_bytes
    runner = (min(config.max_num_reqs, tokens) * 5e-4  # the profile run: an interpreted program a request
              + config.num_kv_groups * 1e-2    # block tables, slot mappings, metadata, per group
              + tokens * 1e-6 + managers * 1e-2  # token buffers; each PCP rank's and DCP peer's manager
              + ubatches * 4e-4                # a split batch's micro-batch slices
              # the dummy run after each step: its warm-up adapters (see estimate_bytes); the
              # dispatch map and get_captured_lora_counts' loop over 1..max_loras + 1
              + loras * 2e-5
              # each capture; the LoRA hook's adapters, min(case, max_loras) a case (lora_utils.py:52-72)
              + shapes * (_lora_cases(config) * 2e-3 + loras * (3 if _lora_cases(config) > 2 else 1) * 2.5e-6)
              + candidates * 5e-6)  # built twice: by the manager's __init__, then for the LoRA cases
    ranks = config.pp_size * 2e-7 if config.pp_size > 1 else 0  # PP's rings (see estimate_bytes)
    # the buffers allocated, filled and copied for the state after start-up: about 2 GB/s
    return (2 if config.pp_size > 1 else 1) * runner + ranks + estimate_bytes(config) * 5e-10


def format_seconds(s: float) -> str:
    """45 -> '45 s', 5400 -> '1.5 h', 4e6 -> '46 days'."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.{0 if s >= 10 * size else 1}f} {unit}"
    return f"{s:.0f} s"


_SIZE_FIELDS = ("max_model_len", "max_num_reqs", "max_num_batched_tokens", "num_speculative_tokens",
                "pcp_size", "dcp_size", "block_size", "kv_groups", "capture_sizes", "max_loras", "pp_size",
                "num_ubatches")


def _heaviest_field(config: RunnerConfig, cost: Callable[[RunnerConfig], float] = estimate_bytes) -> str:
    """The config field whose default would save the most of ``cost``."""
    default, whole = RunnerConfig(), cost(config)
    best, saved = "config", 0.0
    for name in _SIZE_FIELDS:
        if getattr(config, name) != getattr(default, name):
            saving = whole - cost(replace(config, **{name: getattr(default, name)}))
            if saving > saved:
                best, saved = f"config.{name}", saving
    return best


def check_config(config: RunnerConfig, path: str) -> None:
    """The header's config against the machine's memory, the start-up time a runner
    is given and int32: raises TraceError on line 1."""
    ln = _Line(path, 1)
    try:
        have = available_memory()
    except ValueError as exc:
        raise ln.fail("config", str(exc)) from None
    need = estimate_bytes(config)
    if have is not None and need > have[0]:
        raise ln.fail(_heaviest_field(config), f"the runner would allocate about {format_bytes(need)} "
                      f"for this config; {have[1]}")
    took = estimate_seconds(config)
    if took > MAX_SECONDS:
        raise ln.fail(_heaviest_field(config, estimate_seconds), f"the runner would take about "
                      f"{format_seconds(took)} to start and run one full step of this config on a CPU, "
                      f"past the {MAX_SECONDS} s a config is given")
    values = [(f"config.{name}", getattr(config, name)) for name in
              ("max_num_reqs", "max_num_batched_tokens", "max_model_len", "num_speculative_tokens",
               "pcp_size", "dcp_size", "block_size", "max_loras", "pp_size", "num_ubatches",
               "dbo_decode_token_threshold", "dbo_prefill_token_threshold")]
    values += [(f"config.kv_groups[{i}].{name}", getattr(g, name))
               for i, g in enumerate(config.kv_groups) for name in ("window", "block_size")]
    for name, value in values:
        if value > INT32_MAX:
            raise ln.fail(name, f"{value} does not fit the runner's int32 tensors (<= {INT32_MAX})")


# ------------------------------------------------------------------ the steps
class StepBounds:
    """The per-line bounds, with what they need to remember across lines: the
    requests held (after finished, preempted and new ones), the computed tokens
    each will have before its next step, the blocks in each row.

        prompt_len, prefill_len      <= config.max_model_len
        num_computed + scheduled     <= config.max_model_len (computed: the step's own, or
                                        what the earlier steps left for a request without one)
        the batch                    each request's tokens and their sum <= max_num_batched_tokens;
                                     at most max_num_reqs requests
        requests held                <= config.max_num_reqs (after finished, preempted, new)
        block ids                    < config.num_kv_blocks; a request's row <= blocks_per_request
        token_ids, lora_id,          fit int32 (the runner's token table, max_seq_len, LoRA ids)
          prompt_len + max_tokens
        grammar                      names a held request admitted with structured_output; under
                                     speculative decoding that request is greedy (temperature 0)
                                     and verified by vLLM's RejectionSampler (config.rejection_sampler):
                                     the rig drives a grammar on spread rows only, and under drafts
                                     only such a request's rows are spread
        a line's length              <= max_line_bytes(config) (HEADER_LINE_BYTES for line 1)

    These hold for adversarial traces too: they break request *identity* on purpose
    (``simrig.trace_io.trace._LiveIds``), never the sizes the runner's buffers were built for.
    """

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.widths = [config.blocks_per_request(g) for g in range(config.num_kv_groups)]
        self.num_blocks = config.num_kv_blocks
        self.computed: dict[str, int] = {}  # held request id -> computed tokens before its next step
        self.rows: dict[str, list[int]] = {}  # held request id -> blocks in its row, per group
        self.structured: set[str] = set()  # held requests admitted with structured_output

    def apply(self, step: Step, ln: _Line) -> None:
        cfg = self.config
        for gone in (*step.finished, *step.preempted):
            self.computed.pop(gone, None)
            self.rows.pop(gone, None)
            self.structured.discard(gone)
        now: dict[str, int] = {}  # the computed tokens this step states
        for i, req in enumerate(step.new_requests):
            self._new_request(f"new_requests[{i}]", req, ln)
            self._structured(f"new_requests[{i}].structured_output", req, ln)
            self.rows[req.req_id] = self._blocks(f"new_requests[{i}].block_ids", req.req_id, req.block_ids,
                                                 [0] * len(self.widths), ln)
            now[req.req_id] = self.computed[req.req_id] = req.num_computed_tokens
        if len(self.rows) > cfg.max_num_reqs:
            raise ln.fail("new_requests", f"the runner would hold {len(self.rows)} requests, "
                          f"config.max_num_reqs is {cfg.max_num_reqs}")
        for i, upd in enumerate(step.cached):
            name = f"cached_requests[{i}]"
            if upd.num_computed_tokens > cfg.max_model_len:
                raise ln.fail(f"{name}.num_computed_tokens", f"{upd.num_computed_tokens} exceeds "
                              f"config.max_model_len {cfg.max_model_len}")
            held = self.rows.get(upd.req_id)
            row = self._blocks(f"{name}.new_block_ids", upd.req_id, upd.new_block_ids,
                               held if held is not None else [0] * len(self.widths), ln)
            if held is not None:
                self.rows[upd.req_id] = row
                now[upd.req_id] = self.computed[upd.req_id] = upd.num_computed_tokens
        self._batch(step, now, ln)
        for req_id in step.grammar:
            if req_id not in self.structured:
                raise ln.fail(f"grammar.{req_id}", f"request {req_id!r} is not a held structured-output "
                              "request (admit it with \"structured_output\": true)")

    def _structured(self, name: str, req: NewRequest, ln: _Line) -> None:
        self.structured.discard(req.req_id)
        if not req.structured_output:
            return
        cfg = self.config
        if cfg.num_speculative_tokens and not (cfg.rejection_sampler and req.sampling is not None
                                               and req.sampling.temperature == 0.0):
            raise ln.fail(name, "structured output under speculative decoding (config.num_speculative_tokens "
                          f"is {cfg.num_speculative_tokens}) needs a greedy request (sampling.temperature 0) "
                          "verified by vLLM's rejection sampler (config.rejection_sampler standard or block)")
        self.structured.add(req.req_id)

    def _new_request(self, name: str, req: NewRequest, ln: _Line) -> None:
        limit = self.config.max_model_len
        if req.prompt_len > limit:
            raise ln.fail(f"{name}.prompt_len", f"{req.prompt_len} exceeds config.max_model_len {limit}")
        if req.prefill_len is not None and req.prefill_len > limit:
            raise ln.fail(f"{name}.prefill_len", f"{req.prefill_len} exceeds config.max_model_len {limit}")
        if req.max_tokens > INT32_MAX - req.prompt_len:
            raise ln.fail(f"{name}.max_tokens", f"prompt_len + max_tokens must fit the runner's int32 "
                          f"max_seq_len (<= {INT32_MAX}), got {req.prompt_len} + {req.max_tokens}")
        ids = req.prompt_token_ids
        if ids and max(ids) > INT32_MAX:
            j = next(j for j, t in enumerate(ids) if t > INT32_MAX)
            raise ln.fail(f"{name}.token_ids[{j}]", f"{ids[j]} does not fit the runner's int32 token "
                          f"table (<= {INT32_MAX})")
        if req.lora_id is not None and req.lora_id > INT32_MAX:
            raise ln.fail(f"{name}.lora_id", f"{req.lora_id} does not fit the runner's int32 LoRA ids "
                          f"(<= {INT32_MAX})")

    def _blocks(self, name: str, req_id: str, ids: BlockIds | None, row: list[int], ln: _Line) -> list[int]:
        """``row`` (blocks held per group) after appending ``ids``; raises past the
        KV cache's blocks or past a block-table row."""
        if not ids:
            return row
        groups = len(self.widths)
        nested = isinstance(ids[0], list)
        if nested and len(ids) != groups:
            raise ln.fail(name, f"has {len(ids)} lists, the config has {groups} KV cache group(s)")
        if not nested and groups > 1:
            raise ln.fail(name, f"must be one list per KV cache group ({groups} groups)")
        out = []
        for g, group in enumerate(block_groups(ids, groups)):
            where = f"{name}[{g}]" if nested else name
            if group and max(group) >= self.num_blocks:
                j = next(j for j, b in enumerate(group) if b >= self.num_blocks)
                cfg = self.config
                raise ln.fail(f"{where}[{j}]", f"block id {group[j]} is past the KV cache's "
                              f"{self.num_blocks} blocks (ids 0..{self.num_blocks - 1}: config.max_num_reqs "
                              f"{cfg.max_num_reqs} x {sum(self.widths)} blocks per request, "
                              f"plus the null block)")
            held = row[g] + len(group)
            if held > self.widths[g]:
                cfg = self.config
                raise ln.fail(where, f"request {req_id!r} would hold {held} blocks"
                              f"{f' in KV cache group {g}' if groups > 1 else ''}; its block-table row holds "
                              f"{self.widths[g]} (config.max_model_len {cfg.max_model_len} / block size "
                              f"{cfg.group_block_size(g)})")
            out.append(held)
        return out

    def _batch(self, step: Step, now: dict[str, int], ln: _Line) -> None:
        cfg = self.config
        scheduled = step.num_scheduled_tokens
        if len(scheduled) > cfg.max_num_reqs:
            raise ln.fail("num_scheduled_tokens", f"the batch holds {len(scheduled)} requests, "
                          f"config.max_num_reqs is {cfg.max_num_reqs}")
        for req_id, q in scheduled.items():  # each first: a sum of huge counts would not print
            if q > cfg.max_num_batched_tokens:
                raise ln.fail(f"num_scheduled_tokens.{req_id}", f"{q} exceeds config.max_num_batched_tokens "
                              f"{cfg.max_num_batched_tokens}")
        total = step.total_num_scheduled_tokens
        if total > cfg.max_num_batched_tokens:
            raise ln.fail("num_scheduled_tokens", f"the batch schedules {total} tokens, "
                          f"config.max_num_batched_tokens is {cfg.max_num_batched_tokens}")
        for req_id, q in scheduled.items():
            done = now.get(req_id, self.computed.get(req_id))
            if done is not None and done + q > cfg.max_model_len:
                raise ln.fail(f"num_scheduled_tokens.{req_id}", f"{done} computed + {q} scheduled tokens "
                              f"exceed config.max_model_len {cfg.max_model_len}")
            if req_id in self.computed:
                self.computed[req_id] = done + step.num_accepted(req_id)
