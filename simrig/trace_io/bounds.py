"""Input bounded before vLLM runs: every size in a trace against its own config,
and the config against the machine.

``check_config`` and ``StepBounds`` hold every size to what the runner's buffers were built
for (the rules are tabled in ``StepBounds``'s docstring), adversarial traces too. Each
problem is a ``TraceError`` raised while the file is read, so ``simrig replay`` refuses the
input before vLLM is imported. The format's spec (traces/README.md, *Bounds*) lists the same
rules.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import replace

from simrig.step import SYNTH_VOCAB_SIZE, BlockIds, NewRequest, RunnerConfig, Step, block_groups
from simrig.trace_io.trace_format import _Line

INT32_MAX = 2**31 - 1
MEMORY_ENV = "SIMRIG_MEMORY_LIMIT_BYTES"  # overrides the memory this process is taken to have
HEADER_LINE_BYTES = 4 << 20  # the header's longest line (config, source, expect)

# Per token slot (max_num_reqs x max_model_len): the token table's int32 (RequestState.
# all_token_ids) is a tensor; the rest is Python: the reference model's token list, the
# SchedulerOutput's prefill_token_ids handed to the runner, and a step line's text and
# parsed ids when the trace carries them (about 36 bytes per Python int held, each time).
_PYTHON_BYTES_PER_SLOT = 128
_FIXED_PER_GROUP = 16 << 10  # a KV cache group's specs, layer names, pointer tensors
_FIXED_PER_MANAGER = 64 << 10  # one PCPManager's own objects
_FIXED_PER_CAPTURE = 16 << 10  # one captured graph's descriptor and buffers


# ------------------------------------------------------------------ the config
def max_line_bytes(config: RunnerConfig) -> int:
    """The longest step line a trace of ``config`` may hold: every request slot
    sent as new at once, each with max_model_len explicit token ids and a full
    block-table row (12 bytes a number, ``2147483647,`` and a space), plus room
    for ids and maps."""
    per_request = (config.max_model_len + _row_blocks(config)) * 12 + (4 << 10)
    return (1 << 20) + config.max_num_reqs * per_request


def _row_blocks(config: RunnerConfig) -> int:
    return sum(config.blocks_per_request(g) for g in range(config.num_kv_groups))


def estimate_bytes(config: RunnerConfig) -> int:
    """About what replaying ``config`` allocates, at most (vLLM 0.33's MRV2
    buffers, read off vllm/v1/worker/gpu/, and the rig's own), in bytes. The
    tensors count twice: the harness keeps a copy of the state after start-up
    to put back between examples (adapters/reuse.py)."""
    reqs, tokens = config.max_num_reqs, config.max_num_batched_tokens
    slots = reqs * config.max_model_len
    groups, rows = config.num_kv_groups, _row_blocks(config)
    pcp = config.pcp_size
    managers = pcp * config.dcp_size if pcp > 1 else 0  # PCPManager per PCP rank and DCP peer
    query = config.decode_query_len
    tensors = (slots * 4                           # RequestState.all_token_ids [reqs, max_model_len] int32
               + reqs * rows * 4 * 2               # BlockTables: block_tables + input_block_tables, int32
               + managers * reqs * rows * 4        # each PCP manager's local block tables
               + groups * tokens * 8               # BlockTables.slot_mappings [groups, tokens] int64
               + managers * groups * tokens * 8 * (1 + pcp)  # PCP global + gathered slot mappings
               + 2 * tokens * (4 + 8 + 1)          # InputBuffers (the runner's and the dummy runs')
               + reqs * query * 8 * 2              # draft tokens; the drafter stand-in's rows
               + min(tokens, reqs * query) * SYNTH_VOCAB_SIZE * 4 * 2  # stand-in logits + a copy
               + reqs * 128)                       # per-request vectors (lengths, sampling, LoRA)
    fixed = (groups * _FIXED_PER_GROUP + managers * _FIXED_PER_MANAGER
             + len(config.capture_sizes) * _FIXED_PER_CAPTURE)
    return 2 * tensors + slots * _PYTHON_BYTES_PER_SLOT + fixed


def format_bytes(n: int) -> str:
    """2_100_000_000_000 -> '2.1 TB' (decimal units, as memory is usually quoted);
    past 1000 EB, the power of ten ('10^40 B')."""
    if n >= 10**21:
        return f"10^{math.floor(math.log10(n))} B"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if value < 999.95:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} EB"


def parse_byte_count(text: str) -> int:
    """'6000000000', '6G', '512M' (binary multiples, as ``ulimit`` and ``free`` use) -> bytes."""
    raw = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = 1
    if raw and raw[-1] in "KMGT":
        scale = 1024 ** ("KMGT".index(raw[-1]) + 1)
        raw = raw[:-1]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 30:
        raise ValueError(f"{MEMORY_ENV} must be a number of bytes (e.g. 6000000000 or 6G), got {text!r}")
    return int(raw) * scale


def _read_int(path: str, key: str | None = None) -> int | None:
    """An integer file (``memory.max``), or ``key:  N kB`` in a /proc table; None when absent."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            if key is None:
                text = f.read().strip()
                return int(text) if text.isdigit() else None
            for line in f:
                name, _, rest = line.partition(":")
                if name == key:
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        return int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except (OSError, ValueError):
        return None
    return None


def available_memory() -> tuple[int, str] | None:
    """(bytes, how it reads in a sentence) this process can still have: the least
    of the machine's MemAvailable, the cgroup's limit less its usage and the
    address-space limit (RLIMIT_AS) less what is mapped; ``SIMRIG_MEMORY_LIMIT_BYTES``
    replaces them all. None when nothing can be read (the check is skipped)."""
    override = os.environ.get(MEMORY_ENV)
    if override:
        n = parse_byte_count(override)
        return n, f"{MEMORY_ENV} allows {format_bytes(n)}"
    found: list[tuple[int, str]] = []
    avail = _read_int("/proc/meminfo", "MemAvailable")
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    if avail is not None:
        found.append((avail, f"this machine has {format_bytes(avail)} available"))
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 1 << 60:
            left = max(0, limit - usage)
            found.append((left, f"this container has {format_bytes(left)} left of its memory limit"))
            break
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        left = max(0, soft - (_read_int("/proc/self/status", "VmSize") or 0))
        found.append((left, f"this process may map {format_bytes(left)} more (RLIMIT_AS)"))
    return min(found) if found else None


_SIZE_FIELDS = ("max_model_len", "max_num_reqs", "max_num_batched_tokens", "num_speculative_tokens",
                "pcp_size", "dcp_size", "block_size", "kv_groups", "capture_sizes")


def _heaviest_field(config: RunnerConfig) -> str:
    """The config field whose default would save the most of the estimate."""
    default, whole = RunnerConfig(), estimate_bytes(config)
    best, saved = "config", 0
    for name in _SIZE_FIELDS:
        if getattr(config, name) != getattr(default, name):
            saving = whole - estimate_bytes(replace(config, **{name: getattr(default, name)}))
            if saving > saved:
                best, saved = f"config.{name}", saving
    return best


def check_config(config: RunnerConfig, path: str) -> None:
    """The header's config against the machine, then against int32: raises
    TraceError on line 1."""
    ln = _Line(path, 1)
    try:
        have = available_memory()
    except ValueError as exc:
        raise ln.fail("config", str(exc)) from None
    need = estimate_bytes(config)
    if have is not None and need > have[0]:
        raise ln.fail(_heaviest_field(config), f"the runner would allocate about {format_bytes(need)} "
                      f"for this config; {have[1]}")
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

        header  config.*            the estimated allocation <= the memory this process can have;
                                    every count fits the runner's int32 tensors
        step    prompt_len,         <= config.max_model_len
                prefill_len
                num_computed +      <= config.max_model_len (computed: the step's own value, or
                  scheduled            what the earlier steps left for a request without one)
                the batch           each request's tokens and their sum <= max_num_batched_tokens;
                                    at most max_num_reqs requests
                requests held       <= config.max_num_reqs (after finished, preempted, new)
                block ids           < config.num_kv_blocks; a request's row <= blocks_per_request
                token_ids, lora_id, fit int32 (the runner's token table, max_seq_len, LoRA ids)
                prompt_len + max_tokens
        file    a line's length     <= max_line_bytes(config) (HEADER_LINE_BYTES for line 1)

    These hold for every trace, adversarial ones too: an adversarial trace breaks
    request *identity* on purpose (``simrig.trace_io.trace._LiveIds``), never the
    sizes the runner's buffers were built for. Each problem is a ``TraceError``
    (``FILE:LINE: field: problem``, exit 2), raised while the file is read, so
    ``simrig replay`` refuses the input before vLLM is imported or anything is
    allocated. The format's spec (traces/README.md, *Bounds*) lists the same rules.
    """

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.widths = [config.blocks_per_request(g) for g in range(config.num_kv_groups)]
        self.num_blocks = config.num_kv_blocks
        self.computed: dict[str, int] = {}  # held request id -> computed tokens before its next step
        self.rows: dict[str, list[int]] = {}  # held request id -> blocks in its row, per group

    def apply(self, step: Step, ln: _Line) -> None:
        cfg = self.config
        for gone in (*step.finished, *step.preempted):
            self.computed.pop(gone, None)
            self.rows.pop(gone, None)
        now: dict[str, int] = {}  # the computed tokens this step states
        for i, req in enumerate(step.new_requests):
            self._new_request(f"new_requests[{i}]", req, ln)
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
