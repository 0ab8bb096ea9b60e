"""The vLLM lines behind every reason a value is not judged, and behind the dummy checks' rules.

Every entry of ``unchecked.UNCHECKED`` (and every rule of ``RULES``) cites the line of vLLM
that makes it so (``Cite``: a file relative to the vllm package, the function or class, the
line's text; ``absent=True``: the release has no such line). ``verify`` re-reads each line
in an installed release's source, pure text, never an import of vLLM; tests/test_evidence.py
runs it. See docs/decisions.md and ``Cite`` for the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_MR, _IB, _PCP, _CG = ("v1/worker/gpu/model_runner.py", "v1/worker/gpu/input_batch.py",
                       "v1/worker/gpu/pcp_manager.py", "v1/worker/gpu/cudagraph_utils.py")
_WORKER = "v1/worker/gpu_worker.py"
_BT = "v1/worker/gpu/block_table.py"
_UB = "v1/worker/gpu/ubatch_utils.py"
RIG = Path(__file__).resolve().parents[2]  # the checkout: rig citations are relative to it


@dataclass(frozen=True)
class Cite:
    """One line of vLLM (or of the rig, for ``simrig/...`` files) that a reason or rule rests on.

    A reason such as "placeholder by design (make_dummy)" is a claim about vLLM's code; when
    the code changes, the claim silently hides a class of bugs. So every entry of
    ``unchecked.UNCHECKED`` cites the line that makes it so (``Cite``: a file relative to the
    vllm package, the function or class, the line's text), and ``tests/test_evidence.py``
    re-reads each line in the installed release's source (and a side venv's, when one is
    given) and fails when it no longer says so. Where the text differs between releases the
    citation lists each release's text; ``None`` there means the release has no such line:
    for a reason, that the field does not exist there either (``absent=True``).

    A few reasons are about the rig, not vLLM (a value the harness itself records); their
    citation names the rig's file (``simrig/...``) and is re-read the same way.

    ``verify(root, version)`` does the reading: pure text, never an import of vLLM.
    """

    file: str  # relative to the vllm package ("v1/worker/gpu/input_batch.py"), or "simrig/..."
    function: str  # "Class.method", "function" or "Class" (a field comment)
    text: str  # the line, compared with runs of whitespace collapsed
    # release -> its own text where it differs; None: that release has no such line
    releases: dict[str, str | None] = field(default_factory=dict, hash=False, compare=False)
    # the claim is that the function does NOT contain the text (a value it never sets)
    absent: bool = False

    def text_for(self, version: str) -> str | None:
        return self.releases.get(version, self.text)

    def where(self) -> str:
        place = self.file if self.file.startswith("simrig/") else f"vllm/{self.file}"
        return f"{place} {self.function}: {'never ' if self.absent else ''}`{self.text}`"


# A release that lacks the field (and the line) altogether: 0.30.0 has no
# prefill_runs_as_decode_np / max_seq_len_np, 0.30-0.32 no pcp / num_admitted_draft_tokens.
_ONLY_031 = {"0.30.0": None}
_ONLY_033 = {"0.30.0": None, "0.31.0": None, "0.32.0": None}

MAKE_DUMMY = "InputBatch.make_dummy"
EXECUTE = "GPUModelRunner.execute_model"
DISPATCH_CALL = Cite(_MR, EXECUTE, "batch_desc, dp_sync_state = dispatch_cg_and_sync_dp(",
                     {"0.30.0": "batch_desc, dp_sync = dispatch_cg_and_sync_dp(",
                      "0.31.0": "batch_desc, dp_sync = dispatch_cg_and_sync_dp("})
RANDOM_IDS = Cite(_IB, MAKE_DUMMY, 'req_ids = [f"req_{i}_{random_uuid()}" for i in range(num_reqs)]')
ZERO_IDS = Cite(_IB, MAKE_DUMMY, "input_ids = input_buffers.input_ids[:num_tokens].zero_()")
ARANGE_SLOTS = Cite(_IB, MAKE_DUMMY, "idx_mapping = torch.arange(num_reqs, dtype=torch.int64, device=device)",
                    {"0.31.0": "idx_mapping = torch.arange(num_reqs, dtype=torch.int32, device=device)"})
ARANGE_SLOTS_NP = Cite(_IB, MAKE_DUMMY, "idx_mapping_np = np.arange(num_reqs, dtype=np.intp)")
NO_DRAFTS = Cite(_IB, MAKE_DUMMY, "num_draft_tokens_per_req=None,")
NO_PREFILL = Cite(_IB, MAKE_DUMMY, "has_prefill=False,")
NONE_IF_NO_PREFILL = Cite(_IB, "InputBatch", "# None if there are no prefills.", _ONLY_031)
PCP_ONLY_LOCAL = Cite(_IB, "InputBatch", "# Set only on a PCP rank-local batch.", _ONLY_033)
DCP_STEP_SKIPPED = Cite(_MR, EXECUTE, "if self.dcp_size > 1 and not (dummy_run and skip_attn_for_dummy_run):",
                        {"0.30.0": "if not (dummy_run and skip_attn_for_dummy_run):"})
PROFILE_SKIPS_ATTN = Cite(_MR, "GPUModelRunner.profile_run", "skip_attn=True,")

_DUMMY_PLACEHOLDERS: dict[str, tuple[str, tuple[Cite, ...]]] = {
    "req_ids": ("random placeholder ids: a dummy row holds no request", (RANDOM_IDS,)),
    "input_ids": ("placeholder zeros: a dummy row holds no prompt", (ZERO_IDS,)),
    "idx_mapping": ("placeholder slots 0..n-1: a dummy row holds no request state "
                    "(parity checks dtype and shape)", (ARANGE_SLOTS,)),
    "idx_mapping_np": ("placeholder slots 0..n-1 (see idx_mapping)", (ARANGE_SLOTS_NP,)),
    "num_draft_tokens_per_req": ("None: the dummy is draft-free (parity: known)", (NO_DRAFTS,)),
    "prefill_runs_as_decode_np": ("None: the dummy has no prefill, and the field is None without "
                                  "prefills (parity: known)", (NO_PREFILL, NONE_IF_NO_PREFILL)),
    "pcp": ("None: a dummy is staged in the PCP buffers, not partitioned; the field is set only on "
            "a rank-local batch", (PCP_ONLY_LOCAL,)),
}

# (stage, field) -> (reason, the lines that make it so). unchecked.UNCHECKED is built from it.
REASONS: dict[tuple[str, str], tuple[str, tuple[Cite, ...]]] = {
    **{("dummy", f"desc.{name}"): (
        "the idle dummy's own descriptor, from the same dispatch call the dispatch stage judges on "
        "every real batch; the dummy's batch has no requests to predict it from", (DISPATCH_CALL,))
       for name in ("cg_mode", "uniform_token_count", "num_active_loras")},
    ("profile", "dcp_local_seq_lens"): (
        "None: the profile run skips attention, and execute_model's DCP step with it",
        (PROFILE_SKIPS_ATTN, DCP_STEP_SKIPPED)),
    ("prepare", "max_query_len"): (
        "always None: prepare_inputs sets it only under adaptive verification, which the rig never "
        "enables; the reference and semantics checks compare it only when set, so here they cannot fail",
        (Cite(_MR, "GPUModelRunner.prepare_inputs", "if adaptive_verification is not None"),)),
    ("partition", "max_query_len"): (
        "always None: partition_batch builds the rank-local batch without one (the field's default); "
        "semantics compares it only when set",
        (Cite(_PCP, "PCPManager.partition_batch", "max_query_len", absent=True),
         Cite(_IB, "InputBatch", "max_query_len: int | None = None"))),
    ("lifecycle", "runner.pcp_size"): (
        "the PCP world the harness drove (1 where the release cannot drive the configuration); it "
        "selects what the checks expect",
        (Cite("simrig/stage_probes.py", "Probes._lifecycle_end_probe",
              '"runner.pcp_size": self.pcp_size or 1'),)),
    ("gather", "uniform_decode_token_count"): (
        "judged through the descriptor it dispatches (dispatch: uniform_token_count)",
        (Cite(_MR, EXECUTE, "uniform_decode=uniform_tok_count == self.decode_query_len,"),)),
    ("partition", "cu_num_logits_np"): (
        "rank-local logits are never sampled; cu_num_logits itself is related to the rows",
        (Cite(_PCP, "PCPManager.partition_batch", "# Local logits are never sampled."),)),
    ("partition", "num_draft_tokens_per_req"): (
        "None on every rank-local batch: local logits are never sampled; num_draft_tokens is 0 "
        "accordingly", (Cite(_PCP, "PCPManager.partition_batch", "num_draft_tokens_per_req=None,"),)),
    ("partition", "prefill_runs_as_decode_np"): (
        "None on every rank-local batch (a known finding); decode_graph_eligible is related instead",
        (Cite(_PCP, "PCPManager.partition_batch", "prefill_runs_as_decode_np=None,", _ONLY_031),
         Cite(_MR, "GPUModelRunner.gather_batch_req_state", "PCP partitions prefill rows.", _ONLY_031))),
    ("partition", "pcp"): (
        "a group: its fields (pcp.*) are observed and listed one by one",
        (Cite(_IB, "InputBatch", 'pcp: "PCPBatchMetadata | None" = None', _ONLY_033),)),
    ("capture", "desc.cg_mode"): (
        "which descriptors vLLM captures is its candidate list, not predicted (capture sizes are "
        "vLLM's choice); the descriptor is the yardstick of its dummy",
        (Cite(_CG, "CudaGraphManager.capture", "descs = self._capture_descs[mode]"),)),
    **{(stage, name): entry for stage in ("dummy", "capture", "profile")
       for name, entry in _DUMMY_PLACEHOLDERS.items()},
    # micro-batching (DBO): what runs only on a GPU with DP > 1, and what DBO never combines with
    ("ubatch", "forward_contexts"): (
        "not run: vLLM builds the micro-batch runner only with DP > 1, and it takes CUDA streams "
        "(its threads hand off on CUDA events); the split decision and the slices it runs on are "
        "judged (simrig/vllm_parts/ubatch.py)",
        (Cite(_UB, "maybe_build_ubatch_runner",
              "if not parallel_config.use_ubatching or parallel_config.data_parallel_size <= 1:"),
         Cite(_UB, "UBatchRunner.__init__", "self.comm_stream = torch.cuda.Stream(device=device)"))),
    ("ubatch", "dcp_local_seq_lens"): (
        "None: vLLM refuses DBO with context parallelism, so a micro-batch has no DCP lengths",
        (Cite("config/vllm.py", "VllmConfig._get_dbo_unsupported_features",
              'unsupported.append("dual batch overlap with context parallelism")'),)),
    ("ubatch", "slice.requests"): (
        "the request range each micro-batch is cut by; what it cuts (req_ids, idx_mapping_np, "
        "query offsets, sequence lengths) is judged",
        (Cite(_UB, "_slice_input_batch", "req_ids=input_batch.req_ids[req_start : min(req_stop, "
                                         "input_batch.num_reqs)],"),)),
}

# The comments the dummy checks (dummy_batches.py) take their rules from.
RULES: dict[str, Cite] = {
    "profile_real": Cite(_MR, EXECUTE, "# Profiling and warmup must route the dummy tokens to experts",
                         {"0.30.0": None}),
    "profile_not_padding": Cite(_MR, EXECUTE, "is_padding=not is_profile,", {"0.30.0": None}),
    "idle_no_tokens": Cite(_MR, EXECUTE, "# No actual tokens to run. A dummy run for DP or memory profiling."),
    "capture_padding": Cite(_CG, "ModelCudaGraphManager.capture", "# Capture with dummy rows marked as padding."),
    "dcp_capture_context": Cite(_CG, "set_dcp_capture_context",
                                "# Capture FULL graphs with KV context so a host-side skip of DCP context",
                                _ONLY_033),
    "moe_gathers": Cite("model_executor/layers/fused_moe/runner/moe_runner.py", "MoERunner._maybe_dispatch",
                        "hidden_states = get_pcp_group().all_gather(hidden_states, dim=0)"),
    "moe_mask": Cite(_PCP, "PCPManager.moe_is_padding",
                     '"""Expand a capture/dummy padding mask, identical on every PCP rank, to', _ONLY_033),
    "profile_budget": Cite(_WORKER, "Worker.determine_available_memory",
                           "# still need a profile run which compiles the model for"),
    "profile_drafts": Cite(_MR, "GPUModelRunner._dummy_run", "# would exceed the token budget.",
                           {"0.30.0": None}),
    "even_split": Cite(_MR, "GPUModelRunner._dummy_run", "# Distribute the remainder evenly so no dummy request exceeds"),
    "descriptor": Cite(_CG, "BatchExecutionDescriptor",
                       '"""Describes the shape of the batch and CG mode to run; this is used to make shape'),
    "promised_query": Cite(_IB, "InputBatch", "# Longest query the batch may contain. Set when a cudagraph "
                                              "descriptor promises"),
    "budget_fits": Cite("config/scheduler.py", "SchedulerConfig.verify_max_model_len",
                        "if self.max_num_batched_tokens > self.max_num_seqs * max_model_len:"),
    # padded_attn.py: what rows and tokens past the real batch hold, on every path
    "attn_rows": Cite(_MR, "GPUModelRunner.prepare_attn",
                      "# Block tables: num_kv_cache_groups x [num_reqs_padded, max_num_blocks]."),
    "attn_slots": Cite(_MR, "GPUModelRunner.prepare_attn", "# Slot mappings: [num_kv_cache_groups, num_tokens_padded]."),
    "forward_tables": Cite(_BT, "BlockTables.__init__", "# Block tables used for model's forward pass."),
    "rows_past": Cite(_BT, "BlockTables.gather_block_tables",
                      "# Also clear rows left by a larger batch in the shared buffer.", _ONLY_033),
    "dummy_null_rows": Cite(_BT, "BlockTables.get_dummy_block_tables",
                            "# Zero the rows so dummy runs write mamba state to the reserved null"),
    "dummy_context": Cite(_IB, "set_dummy_context",
                          '"""Give each dummy request context_len of context,'),
    "dummy_pad_slots": Cite(_BT, "BlockTables.get_dummy_slot_mappings",
                            "# Fill the entire slot_mappings tensor, not just the first `num_tokens` entries."),
    # 0.30.0 has no such comment: its mixed FULL capture bound is the one 0.31.0 fixed
    # (reports/baselines/history.csv)
    "mixed_full_query": Cite(_CG, "prepare_inputs_to_capture",
                             "# Mixed graphs can replay a single prefill spanning the entire batch,",
                             {"0.30.0": None}),
}


def _norm(text: str) -> str:
    return " ".join(text.split())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def block(source: str, qualname: str) -> str | None:
    """The source of ``qualname`` ("Class.method", "function", "Class") in a module's
    text: its ``def``/``class`` line to the next line indented no deeper that is not
    the end of its signature; None when absent."""
    lines = source.splitlines()
    lo, hi, depth = 0, len(lines), -1
    for part in qualname.split("."):
        pattern = re.compile(rf"^(\s*)(?:async\s+)?(?:def|class)\s+{re.escape(part)}\b")
        start = next((i for i in range(lo, hi) if (m := pattern.match(lines[i]))
                      and len(m.group(1)) > depth), None)
        if start is None:
            return None
        depth = _indent(lines[start])
        end = start + 1
        while end < hi:
            line = lines[end]
            if line.strip() and _indent(line) <= depth and not line.lstrip().startswith((")", "]")):
                break
            end += 1
        lo, hi = start, end
    return "\n".join(lines[lo:hi])


def vllm_version(root: Path) -> str:
    """The release of the vllm package at ``root`` (its _version.py), without importing it."""
    text = (root / "_version.py").read_text(encoding="utf-8")
    found = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", text)
    return found.group(1) if found else "unknown"


def check_cite(cite: Cite, root: Path, version: str) -> str | None:
    """None when ``cite`` holds in the vllm package at ``root`` (release ``version``),
    else what no longer says so."""
    want = cite.text_for(version)
    base = RIG if cite.file.startswith("simrig/") else root
    path = base / cite.file
    if not path.is_file():
        return f"{cite.where()}: {path} is missing" if want is not None else None
    body = block(path.read_text(encoding="utf-8"), cite.function)
    if body is None:
        return f"{cite.where()}: no {cite.function} in {path}" if want is not None else None
    if want is None:  # the release has no such line: it must not have it either
        return f"{cite.where()}: listed as absent in {version}, but present" \
            if _norm(cite.text) in _norm(body) and not cite.absent else None
    present = _norm(want) in _norm(body)
    if present == cite.absent:
        state = "contains" if cite.absent else "no longer contains"
        return f"{cite.where()}: {cite.function} in {path} {state} `{want}` ({version})"
    return None


def verify(root: Path, version: str | None = None) -> list[str]:
    """Every citation (reasons and rules) that does not hold in the vllm package at ``root``."""
    version = version or vllm_version(root)
    cites = [c for _, cs in REASONS.values() for c in cs] + list(RULES.values())
    return [p for c in dict.fromkeys(cites) if (p := check_cite(c, root, version)) is not None]
