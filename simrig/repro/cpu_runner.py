'''The helper section of a standalone reproducer: vLLM's GPUModelRunner on CPU, without a model.

Text, never executed here. It builds the runner as ``simrig.adapters`` does (``wiring.equip``,
``cudagraph.dispatcher_for``, ``vllm_config``, ``platform``) with vLLM's own classes only, so the
file stands alone: ``GPUModelRunner.__new__`` plus the attributes ``execute_model``, ``_dummy_run``,
``profile_run`` and ``capture_model`` read; vLLM's VllmConfig, BlockTables, RequestState, InputBuffers,
PCPManager, LoRA state and ModelCudaGraphManager; stand-ins only for the model, the model state's
attention builders, the sampler and CUDA's streams and graphs. A Recorder (in ``RUNNER``) keeps what
the runner hands the forward (the batch, its cudagraph descriptor, the block tables), observing only.
'''

RUNNER = r'''
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

'''
