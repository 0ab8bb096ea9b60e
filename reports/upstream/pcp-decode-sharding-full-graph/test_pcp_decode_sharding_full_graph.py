"""Reproducer for a vLLM Model Runner V2 input-path defect (written by simrig repro).

Finding class: value_mismatch:dispatch:cg_mode
Where it shows: GPUModelRunner.execute_model
Property (full_decode): a uniform decode batch runs the FULL decode graph its rank-local batch fits (CUDAGraphMode FULL_AND_PIECEWISE / FULL_DECODE_ONLY: FULL graphs for decode batches)
Schedule: 2 step(s), from trace.jsonl (hand-written), each run through
GPUModelRunner.execute_model as a worker runs it.

Fails on a vLLM that shows the class, passes where it is fixed. Run: pytest -q THIS_FILE
Needs only vllm, torch, numpy and pytest; without CUDA the runner is built on CPU and
the MRV2 Triton kernels run in Triton's interpreter.
"""
import contextlib
import dataclasses
import gc
import inspect
import json
import math
import os
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

# ============================================================ a CPU runner
# vLLM's own GPUModelRunner without a model, built as vLLM's worker builds it
# (__init__ needs CUDA streams and weights: __new__ plus the attributes its
# execute_model reads). On a machine without CUDA, MRV2's Triton kernels run in
# Triton's interpreter. Stand-ins: the model (zero hidden states), the model
# state's attention builders (they record the batch), the sampler.
ON_CPU = not torch.cuda.is_available()
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
if ON_CPU:
    os.environ.update(VLLM_TARGET_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")

from vllm import config as vcfg  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched import output as sched  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec)
from vllm.v1.worker.gpu import buffer_utils, cudagraph_utils  # noqa: E402
from vllm.v1.worker.gpu import model_runner as mr  # noqa: E402
from vllm.v1.worker.gpu.block_table import BlockTables  # noqa: E402
from vllm.v1.worker.gpu.input_batch import InputBuffers  # noqa: E402
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402

if ON_CPU:
    buffer_utils.is_uva_available = lambda: False  # pinned memory needs CUDA
DEVICE = torch.device("cpu" if ON_CPU else "cuda")
VOCAB = 1024  # token ids of the schedule (any vocabulary works: no model reads them)
HIDDEN = 8  # the stand-in model's hidden size


def kwargs_for(fn, **kwargs):
    """The keyword arguments this release's ``fn`` takes (0.30-0.33 differ)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


@contextlib.contextmanager
def patched(*patches):
    """(owner, name, value) for the length of a block; names a release lacks are skipped."""
    saved = [(o, n, getattr(o, n)) for o, n, _ in patches if hasattr(o, n)]
    for o, n, v in patches:
        if hasattr(o, n):
            setattr(o, n, v)
    try:
        yield
    finally:
        for o, n, v in reversed(saved):
            setattr(o, n, v)


class Stream:  # a CUDA stream or event on CPU: every copy is done already
    def __init__(self, *a, **k): pass
    def wait_stream(self, *a): pass
    def wait_event(self, *a): pass
    def synchronize(self): pass
    def record(self, *a): pass
    def record_event(self, *a): return Stream()
    def query(self): return True


def without_cuda():
    """CUDA's streams, graphs and memory queries as no-ops (CPU only)."""
    if not ON_CPU:
        return contextlib.nullcontext()
    nothing = contextlib.nullcontext
    graph = type("Graph", (), {"replay": lambda self: None})
    return patched(
        (torch.cuda, "Event", Stream), (torch.cuda, "Stream", Stream),
        (torch.cuda, "current_stream", lambda *a: Stream()), (torch.cuda, "set_stream", lambda s: None),
        (torch.cuda, "stream", lambda s: nothing()), (torch.cuda, "CUDAGraph", graph),
        (torch.cuda, "graph", lambda *a, **k: nothing()),
        (torch.accelerator, "synchronize", lambda *a: None), (torch.accelerator, "empty_cache", lambda: None),
        (torch.accelerator, "get_memory_info", lambda *a: (0, 0)), (gc, "collect", lambda *a: 0),
        (mr, "freeze_gc_for_cudagraph_capture", lambda *a, **k: nothing()),
        (cudagraph_utils, "graph_capture", lambda device=None: nothing()),
        (cudagraph_utils, "capture_pool", lambda pool, *a: nothing(pool)),
        (cudagraph_utils, "set_graph_pool_id", lambda pool: None),
        (cudagraph_utils.current_platform, "graph_pool_handle", lambda: None),
        (cudagraph_utils.current_platform, "get_global_graph_pool", lambda: None),
        (cudagraph_utils, "get_pp_group", lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True)),
        (cudagraph_utils, "current_stream", lambda: None),
        (cudagraph_utils, "is_global_first_rank", lambda: False))


def vllm_config(tmp_dir):
    """vLLM's VllmConfig for CONFIG; the model is a tiny llama config.json (no weights)."""
    model_dir = os.path.join(tmp_dir, "tiny-llama")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "num_hidden_layers": 2, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 1 << 20, "torch_dtype": "float32"}, fh)
    model = vcfg.ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32",
                             max_model_len=CONFIG["max_model_len"])
    config = vcfg.VllmConfig(
        model_config=model,
        scheduler_config=vcfg.SchedulerConfig(
            max_num_seqs=CONFIG["max_num_reqs"], max_num_batched_tokens=CONFIG["max_num_batched_tokens"],
            max_model_len=CONFIG["max_model_len"], is_encoder_decoder=False),
        parallel_config=vcfg.ParallelConfig(prefill_context_parallel_size=CONFIG["pcp_size"]),
        compilation_config=vcfg.CompilationConfig(
            cudagraph_mode=CONFIG["cudagraph_mode"],
            cudagraph_specialize_lora=CONFIG["cudagraph_specialize_lora"]))
    # The CPU platform turns graphs off; the runner dispatches as a CUDA worker would,
    # so the mode is set again and vLLM's own sizing runs on it.
    compilation = config.compilation_config
    compilation.cudagraph_mode = getattr(vcfg.CUDAGraphMode, CONFIG["cudagraph_mode"])
    compilation.cudagraph_capture_sizes = list(CONFIG["capture_sizes"]) or None
    compilation.max_cudagraph_capture_size = None
    config._set_cudagraph_sizes()
    from vllm.v1.attention.backend import AttentionCGSupport
    compilation.resolve_cudagraph_mode_and_sizes(  # as initialize_kv_cache does
        AttentionCGSupport.ALWAYS, None, 1 + CONFIG["num_speculative_tokens"], use_v2_model_runner=True,
        max_num_reqs=CONFIG["max_num_reqs"], piecewise_capture_available=True)
    return config


def kv_cache_config():
    groups, width = [], []
    for g, group in enumerate(CONFIG["kv_groups"]):
        common = dict(block_size=CONFIG["block_size"], num_kv_heads=1, head_size=8, dtype=torch.float32)
        spec = (SlidingWindowSpec(sliding_window=group["window"], **common) if group["kind"] == "sliding_window"
                else FullAttentionSpec(**common))
        groups.append(KVCacheGroupSpec([f"model.layers.{g}.self_attn.attn"], spec))
        width.append(-(-CONFIG["max_model_len"] // CONFIG["block_size"]))
    num_blocks = CONFIG["max_num_reqs"] * sum(width) + 1
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups), width


def block_tables(kv_config, width):
    """vLLM's BlockTables, as initialize_kv_cache builds them on this release."""
    specs = [g.kv_cache_spec for g in kv_config.kv_cache_groups]
    sizes = [CONFIG["block_size"]] * len(specs)
    return BlockTables(**kwargs_for(
        BlockTables, block_sizes=sizes, kernel_block_sizes=sizes, max_num_reqs=CONFIG["max_num_reqs"],
        max_num_batched_tokens=CONFIG["max_num_batched_tokens"], max_num_blocks_per_group=width,
        device=DEVICE, cp_size=1, cp_rank=0, cp_interleave=1, dcp_sharded=[False] * len(specs),
        sliding_window_reach=[getattr(s, "num_retained_tokens", 0) for s in specs]))


class Model:  # the forward: zero hidden states, one row per (padded) token
    def __init__(self): self.vocab_size = VOCAB
    def __call__(self, input_ids=None, positions=None, **kw):
        return torch.zeros(positions.shape[-1] if positions is not None else input_ids.shape[0], HIDDEN)
    def compute_logits(self, hidden): return torch.zeros(hidden.shape[0], VOCAB)
    def modules(self):  # a torch-compiled model, as PIECEWISE graphs require
        wrapper = cudagraph_utils.TorchCompileWithNoGuardsWrapper
        compiled = wrapper.__new__(wrapper)
        compiled.__dict__["do_not_compile"] = False
        return [self, compiled]


def rows_past(table):
    """The rows of the persistent table ``table`` heads (vLLM hands attention
    ``table[:n]``), past its own rows, that hold a block id."""
    base = table._base
    if base is None or base.dim() != 2 or table.storage_offset() != base.storage_offset():
        return []
    past = base[table.shape[0]:]
    return (torch.nonzero(past.ne(0).any(dim=1)).flatten() + table.shape[0]).tolist()


class Recorder:
    """The model state's attention builders need the model's layers: this one
    records each batch the forward runs (``prepare_attn``; the profile run skips
    attention, so ``prepare_inputs`` too), with its mode and block tables."""
    num_new_sampled_tokens_per_step = 1
    supports_mm_inputs = False

    def __init__(self):
        self.max_model_len, self.path, self.seen = CONFIG["max_model_len"], "step", []
    def prepare_attn(self, batch, cg_mode, tables, slot_mappings, *a, **k):
        self.seen.append(SimpleNamespace(path=self.path, batch=snapshot(batch), cg_mode=cg_mode,
                                         block_tables=[t.clone() for t in tables or ()],
                                         rows_past=[rows_past(t) for t in tables or ()]))
        return {}
    def prepare_inputs(self, batch, req_states):
        if self.path == "profile":
            self.seen.append(SimpleNamespace(path="profile", batch=snapshot(batch), cg_mode=None,
                                             block_tables=[]))
        return {}

    def add_request(self, *a): pass
    def remove_request(self, *a): pass
    def apply_staged_writes(self): pass
    def postprocess_state(self, *a, **k): pass
    def preprocess_state(self, *a, **k): pass
    def prepare_dummy_inputs(self, *a): return {}
    def capture_inner_cudagraphs(self, *a, **k): pass
    def custom_sampler(self, *a): return None


def snapshot(batch):
    """The batch's fields as they are now (they are views into buffers the next step reuses)."""
    copy = lambda v: v.clone() if isinstance(v, torch.Tensor) else v.copy() if isinstance(v, np.ndarray) else v
    return SimpleNamespace(**{f.name: copy(getattr(batch, f.name)) for f in dataclasses.fields(batch)})


class Sampler:  # the sampler needs logits of a model; run_step samples in its place
    penalties_state = SimpleNamespace(output_bin_counts=None)  # no penalties

    def add_request(self, *a): pass
    def remove_request(self, *a): pass
    def apply_staged_writes(self): pass
    def __call__(self, logits, batch): pass  # the profile run's warm-up


class LoraManager:  # loads adapter weights into the model's layers: nothing to load here
    def __init__(self): self.activations = []  # each set_active_adapters call: (requests, mapping)
    def set_active_adapters(self, requests, mapping): self.activations.append((requests, mapping))
    def get_dummy_lora_warmup_rank(self, rank): return rank
    def dummy_lora_cache(self): return contextlib.nullcontext()
    def add_dummy_lora(self, request, rank): return True
    def list_adapters(self): return set()
    def remove_all_adapters(self): pass


def build_runner(tmp_dir):
    """The runner, its cudagraph manager and (under PCP) rank 0's PCPManager."""
    config = vllm_config(tmp_dir)
    kv_config, width = kv_cache_config()
    r = mr.GPUModelRunner.__new__(mr.GPUModelRunner)
    r.vllm_config, r.parallel_config = config, config.parallel_config
    r.observability_config = config.observability_config
    drafts = CONFIG["num_speculative_tokens"]  # the drafter is not run: the schedule names its drafts
    r.device, r.max_num_reqs, r.decode_query_len, r.vocab_size = DEVICE, CONFIG["max_num_reqs"], 1 + drafts, VOCAB
    r.max_model_len, r.max_num_tokens = CONFIG["max_model_len"], CONFIG["max_num_batched_tokens"]
    r.num_speculative_steps, r.model_config = drafts, SimpleNamespace(rswa_window=None)
    for name in ("adaptive_verification", "fast_prefill", "pooling_runner", "pp_handler", "encoder_cache",
                 "kv_block_zeroer", "routed_experts_capturer", "intermediate_tensors", "aux_output_connector",
                 "ubatch_runner", "speculator", "rejection_sampler", "batch_sharder",
                 "structured_outputs_worker", "execute_model_state", "pcp_manager"):
        setattr(r, name, None)
    for name in ("use_pp", "is_encoder_decoder", "uses_inputs_embeds", "supports_mm_inputs",
                 "use_aux_hidden_state_outputs", "check_ep_fault", "use_dcp"):
        setattr(r, name, False)
    r.is_first_pp_rank = r.is_last_pp_rank = True
    for name, value in (("dp_size", 1), ("dp_rank", 0)):  # properties from 0.33
        if not isinstance(getattr(type(r), name, None), property):
            setattr(r, name, value)
    r.dcp_size, r.dcp_rank, r.cp_interleave, r._draft_workspace_lane = 1, 0, 1, 0
    r.req_states = RequestState(**kwargs_for(
        RequestState, max_num_reqs=CONFIG["max_num_reqs"], max_model_len=CONFIG["max_model_len"],
        max_num_batched_tokens=CONFIG["max_num_batched_tokens"], num_speculative_steps=drafts,
        vocab_size=VOCAB, device=DEVICE))
    r.input_buffers = InputBuffers(max_num_reqs=CONFIG["max_num_reqs"],
                                   max_num_tokens=CONFIG["max_num_batched_tokens"], device=DEVICE)
    from vllm.v1.worker.gpu.kv_connector import NO_OP_KV_CONNECTOR
    r.kv_connector = NO_OP_KV_CONNECTOR
    try:
        from vllm.v1.worker.gpu.ec_connector import get_ec_connector
        r.ec_connector = get_ec_connector(config, None)
    except ImportError:
        r.ec_connector = None
    try:
        from vllm.v1.worker.gpu.eplb_utils import EPLBController
        r.eplb = EPLBController(config.parallel_config, DEVICE)
    except ImportError:
        r.eplb = None
    timing = getattr(mr, "StepTimingCollector", None)
    r.step_timing = timing() if timing is not None else None
    r.kv_cache_config, r.block_tables = kv_config, block_tables(kv_config, width)
    r.attn_groups = [[] for _ in CONFIG["kv_groups"]]
    r.model, r.model_state = Model(), Recorder()
    from vllm.v1.worker.gpu.lora_utils import LoraState, get_lora_capture_cases
    r.lora_config = (vcfg.LoRAConfig(max_loras=CONFIG["max_loras"]) if CONFIG["max_loras"] else None)
    r.lora_state, r.lora_manager = LoraState(max_num_reqs=CONFIG["max_num_reqs"]), LoraManager()
    r.sampler = Sampler()
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker
    r.prompt_logprobs_worker = PromptLogprobsWorker(CONFIG["max_num_reqs"],
                                                    **kwargs_for(PromptLogprobsWorker, device=DEVICE))
    if ON_CPU:
        r.__dict__["main_stream"] = Stream()  # a cached_property
    r.output_copy_stream = Stream() if ON_CPU else torch.cuda.Stream(DEVICE)
    with without_cuda():
        from vllm.v1.worker.gpu.spec_decode.utils import DraftTokensHandler
        r.draft_tokens_handler = DraftTokensHandler(DEVICE)
        manager = cudagraph_utils.ModelCudaGraphManager(
            config, None, config.compilation_config.cudagraph_mode, decode_query_len=1 + drafts)
    # as GPUModelRunner.__init__ / initialize_kv_cache set them
    manager.lora_capture_cases = list(get_lora_capture_cases(r.lora_config, config.compilation_config))
    manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
    manager._candidates, manager._capture_descs = {}, {}
    manager._init_candidates()
    manager.device, r.cudagraph_manager = DEVICE, manager
    if CONFIG["pcp_size"] > 1:
        from vllm.v1.worker.gpu.pcp_manager import PCPManager
        r.pcp_manager = PCPManager(**kwargs_for(
            PCPManager, pcp_world_size=CONFIG["pcp_size"], pcp_rank=0, device=DEVICE,
            max_num_reqs=CONFIG["max_num_reqs"], max_num_tokens=CONFIG["max_num_batched_tokens"],
            dcp_world_size=1, dcp_rank=0, shard_decode_requests=CONFIG["shard_decode_requests"],
            block_tables=r.block_tables))
        if getattr(r.pcp_manager, "_block_tables", None) is None and hasattr(r.pcp_manager, "set_block_tables"):
            r.pcp_manager.set_block_tables(r.block_tables)
    return r



def scheduler_output(step):
    """One step of the schedule as this release's SchedulerOutput."""
    def build(cls, **kw):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        args = {k: v for k, v in kw.items() if k in fields}
        for name, f in fields.items():  # num_common_prefix_blocks is required before 0.32
            if name not in args and f.init and f.default is dataclasses.MISSING \
                    and f.default_factory is dataclasses.MISSING:
                args[name] = []
        return cls(**args)

    groups = len(CONFIG["kv_groups"])
    new = []
    for q in step["new"]:
        ids = [token(q["id"], p) for p in range(q["prefill_len"])]
        lora = None
        if q.get("lora_id"):
            from vllm.lora.request import LoRARequest
            lora = LoRARequest(f"adapter-{q['lora_id']}", q["lora_id"], f"/adapters/{q['lora_id']}")
        new.append(build(sched.NewRequestData, req_id=q["id"], prompt_token_ids=ids[:q["prompt_len"]],
                         mm_features=[], sampling_params=SamplingParams(max_tokens=q["max_tokens"]),
                         pooling_params=None, block_ids=tuple(per_group(q["block_ids"], groups)),
                         num_computed_tokens=q["num_computed_tokens"], lora_request=lora,
                         prefill_token_ids=ids))
    cached = step["cached"]
    nst = step["num_scheduled_tokens"]
    return build(
        sched.SchedulerOutput, scheduled_new_reqs=new, total_num_scheduled_tokens=sum(nst.values()),
        scheduled_cached_reqs=build(
            sched.CachedRequestData, req_ids=[c["id"] for c in cached], resumed_req_ids=set(),
            new_token_ids=[[] for _ in cached], all_token_ids={}, num_output_tokens=[0 for _ in cached],
            num_computed_tokens=[c["num_computed_tokens"] for c in cached],
            new_block_ids=[None if c["new_block_ids"] is None else tuple(per_group(c["new_block_ids"], groups))
                           for c in cached]),
        num_scheduled_tokens=dict(nst), scheduled_encoder_inputs={},
        scheduled_spec_decode_tokens={k: [-1] * n for k, n in step.get("spec_tokens", {}).items() if n},
        finished_req_ids=set(step["finished"]), free_encoder_mm_hashes=[],
        preempted_req_ids=set(step["preempted"]) or None)


def per_group(block_ids, groups):
    """Block ids as one list per KV cache group (a flat list is group 0's)."""
    if block_ids and isinstance(block_ids[0], list):
        return [list(b) for b in block_ids]
    return [list(block_ids)] + [[] for _ in range(groups - 1)]


def token(req_id, position):
    """A token id for a position of a request (the schedule carries lengths only)."""
    return (zlib.crc32(req_id.encode()) * 31 + position * 2_654_435_761) % VOCAB


def run_step(runner, step):
    """One scheduler step through execute_model, then the sampler's hand-back:
    every request with a logit row samples one token (a stand-in sampler), and
    vLLM's own postprocess_sampled advances the requests' state."""
    with without_cuda():
        runner.execute_model(scheduler_output(step))
    state, runner.execute_model_state = runner.execute_model_state, None
    runner.forward_batch = None if state is None else state.input_batch  # the batch the forward ran
    if state is None:
        return
    batch = getattr(runner.pcp_manager, "_global_batch", None) or state.input_batch
    n = batch.num_reqs
    num_logits = np.diff(batch.cu_num_logits_np[: n + 1]).astype(np.int32)
    sampled = torch.tensor([[token(q, 0)] * max(int(num_logits.max()), 1) for q in batch.req_ids])
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    num_sampled, num_rejected = get_num_sampled_and_rejected(
        torch.from_numpy(num_logits).to(DEVICE), batch.seq_lens[:n], batch.cu_num_logits,
        batch.idx_mapping, runner.req_states.prefill_len.gpu)
    runner.postprocess_sampled(batch.idx_mapping, sampled.to(DEVICE), num_sampled, num_rejected,
                               batch.query_start_loc)


def dispatches(runner):
    """Record every descriptor the cudagraph manager dispatches (observing only)."""
    manager, seen = runner.cudagraph_manager, []
    real = manager.dispatch
    def dispatch(*a, **k):
        desc = real(*a, **k)
        seen.append(desc)
        return desc
    manager.dispatch = dispatch
    manager.run_fullgraph = lambda desc: torch.zeros(desc.num_tokens, HIDDEN)  # no CUDA graph to replay
    return seen


def profile_run(runner):
    """The worker's memory profile: GPUModelRunner.profile_run."""
    runner.model_state.path = "profile"
    try:
        with without_cuda():
            runner.profile_run()
    finally:
        runner.model_state.path, runner.execute_model_state = "step", None


def capture_model(runner):
    """The worker's start-up capture: GPUModelRunner.capture_model (no graph is recorded on CPU)."""
    from vllm.v1.worker import workspace
    if not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(DEVICE)
    runner.model_state.path = "capture"
    try:
        with without_cuda():
            runner.capture_model()
    finally:
        runner.model_state.path = "step"
        workspace.unlock_workspace()


def dummy_run(runner, num_tokens, uniform_decode=False):
    """An idle data-parallel rank's step: GPUModelRunner._dummy_run."""
    runner.model_state.path = "dummy"
    try:
        with without_cuda():
            runner._dummy_run(num_tokens, uniform_decode=uniform_decode)
    finally:
        runner.model_state.path, runner.execute_model_state = "step", None


# ============================================================ the schedule
CONFIG = {'max_num_reqs': 4,
 'max_num_batched_tokens': 64,
 'max_model_len': 128,
 'block_size': 16,
 'num_speculative_tokens': 0,
 'kv_groups': [{'kind': 'full', 'window': 0}],
 'pcp_size': 2,
 'shard_decode_requests': True,
 'cudagraph_mode': 'FULL_AND_PIECEWISE',
 'capture_sizes': [1, 2, 4, 8],
 'max_loras': 0,
 'cudagraph_specialize_lora': True}
CLASS = {'kind': 'value_mismatch',
 'stage': 'dispatch',
 'field': 'cg_mode',
 'property': 'full_decode',
 'exception_type': 'Exception',
 'declared': '',
 'meaning': 'a uniform decode batch runs the FULL decode graph its rank-local batch fits '
            '(CUDAGraphMode FULL_AND_PIECEWISE / FULL_DECODE_ONLY: FULL graphs for decode batches)'}
# The scheduler's steps, one per line: new requests (prompt and prefill lengths, block
# ids), cached requests (computed tokens, new block ids), tokens scheduled per request.
STEPS = [
    {'new': [{'id': 'a', 'prompt_len': 4, 'prefill_len': 4, 'num_computed_tokens': 0, 'max_tokens': 8, 'block_ids': [1]}, {'id': 'b', 'prompt_len': 4, 'prefill_len': 4, 'num_computed_tokens': 0, 'max_tokens': 8, 'block_ids': [2]}, {'id': 'c', 'prompt_len': 4, 'prefill_len': 4, 'num_computed_tokens': 0, 'max_tokens': 8, 'block_ids': [3]}, {'id': 'd', 'prompt_len': 4, 'prefill_len': 4, 'num_computed_tokens': 0, 'max_tokens': 8, 'block_ids': [4]}], 'cached': [], 'num_scheduled_tokens': {'a': 4, 'b': 4, 'c': 4, 'd': 4}, 'finished': [], 'preempted': []},
    {'new': [], 'cached': [{'id': 'a', 'num_computed_tokens': 4, 'new_block_ids': None}, {'id': 'b', 'num_computed_tokens': 4, 'new_block_ids': None}, {'id': 'c', 'num_computed_tokens': 4, 'new_block_ids': None}, {'id': 'd', 'num_computed_tokens': 4, 'new_block_ids': None}], 'num_scheduled_tokens': {'a': 1, 'b': 1, 'c': 1, 'd': 1}, 'finished': [], 'preempted': []},
]


# ============================================================ the property
def mode(desc):
    return getattr(desc.cg_mode, "name", str(desc.cg_mode))


def dtype_of(value):
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, np.ndarray):
        return f"numpy.{value.dtype}"
    return type(value).__name__


def field(batch, name):
    for part in name.split("."):
        batch = getattr(batch, part, None)
    return batch


def drive(runner):
    """What the worker runs, in its order: the profile run and graph capture at
    start-up (where the class lives there), then every step through execute_model,
    each followed by the dummy run an idle data-parallel rank would make."""
    dispatched = dispatches(runner)
    if CLASS["stage"] == "profile":
        profile_run(runner)
    captured = []
    if CLASS["stage"] == "capture" and runner.cudagraph_manager.needs_capture():
        capture_model(runner)
        # the descriptors vLLM captured graphs for (its own list, per mode)
        captured = [d for descs in runner.cudagraph_manager._capture_descs.values() for d in descs]
    runner.cudagraph_manager._graphs_captured = True  # dispatch as after the start-up capture
    steps = []
    for index, step in enumerate(STEPS):
        first, first_lora = len(dispatched), len(runner.lora_manager.activations)
        run_step(runner, step)
        steps.append(SimpleNamespace(index=index, step=step, descs=dispatched[first:],
                                     lora=runner.lora_manager.activations[first_lora:],
                                     batch=getattr(runner, "forward_batch", None)))
        if CLASS["stage"] == "dummy" and step["num_scheduled_tokens"] and step.get("idle_dummy", True):
            dummy_run(runner, sum(step["num_scheduled_tokens"].values()))
    return steps, captured


def at_stage(seen):
    """The batches of the class's stage (prepare: the real steps' batches)."""
    path = {"prepare": "step", "partition": "step"}.get(CLASS["stage"], CLASS["stage"])
    records = [r for r in seen if r.path == path]
    assert records, f"no batch of stage {CLASS['stage']} reached the forward"
    return records


def where(record):
    return {"step": "execute_model", "dummy": "_dummy_run", "profile": "profile_run",
            "capture": "capture_model"}[record.path]


def check_dtype(seen):
    real = [r for r in seen if r.path == "step"]
    for r in at_stage(seen):
        value = field(r.batch, CLASS["field"])
        if real and r.path != "step":
            expected = dtype_of(field(real[-1].batch, CLASS["field"]))
            assert dtype_of(value) == expected, (
                f"{where(r)}: InputBatch.{CLASS['field']} is {dtype_of(value)}, the real batch's "
                f"(execute_model) is {expected}: a graph captured on this batch and replayed with "
                f"the real one sees two dtypes. Expected {CLASS['declared']}: {CLASS['meaning']}")
        assert value is None or dtype_of(value) == CLASS["declared"], (
            f"{where(r)}: InputBatch.{CLASS['field']} is {dtype_of(value)}, expected "
            f"{CLASS['declared']}: {CLASS['meaning']}")


def check_present(seen):
    real = [r for r in seen if r.path == "step" and field(r.batch, CLASS["field"]) is not None]
    assert real, f"the schedule never makes execute_model build InputBatch.{CLASS['field']}"
    for r in at_stage(seen):
        assert field(r.batch, CLASS["field"]) is not None, (
            f"{where(r)}: InputBatch.{CLASS['field']} is None where the real batch (execute_model) "
            f"has {dtype_of(field(real[-1].batch, CLASS['field']))}: {CLASS['meaning']}")


def check_positions(seen):
    for r in at_stage(seen):
        b = r.batch
        qsl = b.query_start_loc_np[: b.num_reqs + 1] if hasattr(b, "query_start_loc_np") \
            else b.query_start_loc[: b.num_reqs + 1].cpu().numpy()
        seq_lens = b.seq_lens[: b.num_reqs].cpu().numpy()
        expected = np.concatenate([np.arange(s - (e - a), s) for a, e, s in zip(qsl[:-1], qsl[1:], seq_lens)])
        got = b.positions[: len(expected)].cpu().numpy()
        bad = np.flatnonzero(got != expected)
        assert bad.size == 0, (
            f"{where(r)}: InputBatch.positions[{bad[0]}] is {got[bad[0]]}, expected {expected[bad[0]]} "
            f"(row by row: seq_len - query_len + j; first rows expected {expected[:8].tolist()}, got "
            f"{got[:8].tolist()}): {CLASS['meaning']}")


def check_block_tables(seen):
    size = CONFIG["block_size"]
    for r in (r for r in seen if r.path == "step"):
        b = r.batch
        computed = (b.seq_lens[: b.num_reqs].cpu().numpy()
                    - np.diff(b.query_start_loc[: b.num_reqs + 1].cpu().numpy()))
        for g, group in enumerate(CONFIG["kv_groups"]):
            if group["kind"] != "sliding_window":
                continue
            for i, req_id in enumerate(b.req_ids):
                below = max(int(computed[i]) - (group["window"] - 1), 0) // size
                row = r.block_tables[g][i, :below].cpu().tolist()
                assert all(x == 0 for x in row), (
                    f"execute_model: request {req_id}, KV group {g} (sliding window {group['window']}): "
                    f"its first scheduled position is {int(computed[i])}, so blocks 0..{below - 1} lie "
                    f"wholly below the window and must be the null block 0; the forward's block table "
                    f"holds {row}: {CLASS['meaning']}")


def check_rows_past(seen):
    group = int(CLASS["field"].rsplit(".", 1)[1])
    for r in at_stage(seen):
        past = r.rows_past[group] if group < len(r.rows_past) else []
        assert not past, (
            f"{where(r)}: rows {past} of KV group {group}'s persistent block table, past the "
            f"{r.block_tables[group].shape[0]} rows handed to attention, still hold block ids a larger "
            f"earlier batch gathered there: {CLASS['meaning']}")


def check_full_decode(steps):
    sizes = list(runner_sizes())
    for s in steps:
        nst = s.step["num_scheduled_tokens"]
        decodes = all(n == 1 for n in nst.values()) and not s.step["new"] and nst
        local = math.ceil(len(nst) / CONFIG["pcp_size"])
        if not (decodes and sizes and local <= max(sizes)):
            continue
        desc = s.descs[-1]
        assert mode(desc) == "FULL", (
            f"step {s.index}: a decode-only batch of {len(nst)} requests (at most {local} per PCP rank "
            f"of {CONFIG['pcp_size']}) fits the FULL decode graphs (capture sizes {sizes}), but "
            f"execute_model dispatched {mode(desc)} (num_tokens={desc.num_tokens}, "
            f"num_reqs={desc.num_reqs}): {CLASS['meaning']}")


def check_lora(steps, captured):
    if CLASS["stage"] == "capture":
        free = [d for d in captured if getattr(d, "num_active_loras", None) == 0]
        assert captured and not free, (
            f"capture_model captured {len(free)} LoRA-free graph(s) (num_active_loras=0) with "
            f"cudagraph_specialize_lora=False: {CLASS['meaning']}")
        return
    for s in steps:
        for desc in s.descs:
            assert getattr(desc, "num_active_loras", None) != 0, (
                f"step {s.index}: execute_model dispatched a LoRA-free graph (num_active_loras=0, "
                f"{mode(desc)}) with cudagraph_specialize_lora=False: {CLASS['meaning']}")


def check_lora_mapping(steps):
    """What execute_model hands _set_active_loras: each batch row (prompt_mapping) and each
    scheduled token (token_mapping) maps to its request's adapter id, 0 for none; the
    active set is the batch's distinct adapters."""
    name, adapter = CLASS["field"].split(".", 1)[1], {}
    for s in steps:
        for r in s.step["finished"] + s.step["preempted"]:
            adapter.pop(r, None)
        adapter.update({q["id"]: q.get("lora_id") or 0 for q in s.step["new"]})
        if not s.lora or s.batch is None:
            continue
        requests, mapping = s.lora[-1]
        rows = [adapter.get(r, 0) for r in s.batch.req_ids]
        counts = [int(n) for n in s.batch.num_scheduled_tokens[:len(rows)]]
        want = {"prompt_mapping": rows, "token_mapping": [a for a, n in zip(rows, counts) for _ in range(n)],
                "active_ids": sorted({a for a in rows if a})}[name]
        got = {"prompt_mapping": [int(a) for a in mapping.prompt_mapping],
               "token_mapping": [int(a) for a in mapping.index_mapping],
               "active_ids": sorted(int(r.lora_int_id) for r in requests)}[name]
        assert got == want, (
            f"step {s.index}: execute_model handed _set_active_loras {name} {got}; the batch's requests "
            f"{list(s.batch.req_ids)} run adapters {rows} (0: none), so it should be {want}: "
            f"{CLASS['meaning']}")


def runner_sizes():
    return [int(x) for x in RUNNER_CONFIG.compilation_config.cudagraph_capture_sizes or ()]


def test_value_mismatch_dispatch_cg_mode(tmp_path):
    global RUNNER_CONFIG
    runner = build_runner(str(tmp_path))
    RUNNER_CONFIG = runner.vllm_config
    # The property fails as an AssertionError; anything else is the file's own trouble.
    raised = None
    try:
        steps, captured = drive(runner)
    except Exception as exc:  # judged below, outside the handler (a clean traceback)
        raised = exc
    if CLASS["property"] == "raises":
        assert raised is not None, (f"the runner accepted the schedule silently (no "
                                    f"{CLASS['exception_type']} in {len(STEPS)} step(s)): {CLASS['meaning']}")
        assert CLASS["exception_type"] in ("Exception", type(raised).__name__), (
            f"the runner raised {type(raised).__name__}: {raised}, expected {CLASS['exception_type']}: "
            f"{CLASS['meaning']}")
        return
    if raised is not None:
        message = (f"the runner raised {type(raised).__name__}: {raised} on a schedule that keeps the "
                   "scheduler's contract")
        assert CLASS["property"] != "no_raise", f"{message}: {CLASS['meaning']}"
        pytest.fail(f"{message}, before the property could be checked")
    seen = runner.model_state.seen
    {"dtype": lambda: check_dtype(seen), "present": lambda: check_present(seen),
     "positions": lambda: check_positions(seen), "block_tables": lambda: check_block_tables(seen),
     "rows_past": lambda: check_rows_past(seen),
     "full_decode": lambda: check_full_decode(steps), "lora": lambda: check_lora(steps, captured),
     "lora_mapping": lambda: check_lora_mapping(steps),
     "no_raise": lambda: None}[CLASS["property"]]()
