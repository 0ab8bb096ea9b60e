'''The standalone pytest file ``simrig repro`` writes: a template with four holes.

    @@DOC@@   the module docstring (class, property, trace, how to run)
    @@DATA@@  CONFIG, CLASS and STEPS as Python literals
    @@TEST@@  the test function's name

The file imports only vLLM, torch, numpy, pytest and the standard library (no
simrig). It adapts to the installed vLLM release by looking at signatures and
dataclass fields at run time, as ``simrig.vllm_api.versions`` does, and builds
the model-less runner the way ``simrig.adapters.runner`` does: the real
GPUModelRunner methods, RequestState, InputBuffers and PCPManager, with
stand-ins only for the model state, KV block tables and LoRA bookkeeping.
'''

TEMPLATE = r'''"""@@DOC@@"""
import dataclasses
import inspect
import os
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

# Platform, before vLLM is imported: on a machine without CUDA, MRV2's Triton
# kernels run in Triton's interpreter on CPU (pinned-memory buffers need CUDA).
ON_CPU = not torch.cuda.is_available()
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
if ON_CPU:
    os.environ.update(VLLM_TARGET_DEVICE="cpu", CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")

from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched import output as sched  # noqa: E402
from vllm.v1.worker.gpu import buffer_utils  # noqa: E402
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor  # noqa: E402
from vllm.v1.worker.gpu.input_batch import (  # noqa: E402
    InputBatch, InputBuffers, get_num_sampled_and_rejected)
from vllm.v1.worker.gpu.model_runner import GPUModelRunner  # noqa: E402
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402

if ON_CPU:
    buffer_utils.is_uva_available = lambda: False
DEVICE = torch.device("cpu" if ON_CPU else "cuda")
VOCAB = 32_000

@@DATA@@


# ----------------------------------------------------------------- the runner
def synth_token(req_id, position):
    """The token id at a position of a request (the trace carries lengths only)."""
    return (zlib.crc32(req_id.encode()) * 31 + position * 2_654_435_761) % VOCAB


def _kwargs(fn, **kwargs):
    """The keyword arguments this release's ``fn`` accepts (0.30-0.33 differ)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _build(cls, **kwargs):
    """A SchedulerOutput dataclass by keyword, on any release: fields it lacks are
    dropped; num_common_prefix_blocks (required before 0.32) is empty."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    args = {k: v for k, v in kwargs.items() if k in fields}
    for name, f in fields.items():
        if name not in args and f.init and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            assert name == "num_common_prefix_blocks", f"{cls.__name__}.{name} is unknown to this test"
            args[name] = []
    return cls(**args)


class _ModelState:  # plain text model: nothing the input path reads
    num_new_sampled_tokens_per_step = 1

    def add_request(self, *a): pass
    def remove_request(self, *a): pass
    def apply_staged_writes(self): pass
    def postprocess_state(self, *a): pass


class _BlockTables:  # KV block ids: no InputBatch field is derived from them
    def append_block_ids(self, *a, **k): pass


class _LoraState:
    def add_request(self, *a): pass
    def remove_request(self, *a): pass


def make_runner():
    """GPUModelRunner without a model: __init__ needs CUDA streams and a model, so
    __new__ plus the attributes the input path reads."""
    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.device, runner.max_num_reqs = DEVICE, CONFIG["max_num_reqs"]
    runner.decode_query_len = 1 + CONFIG["num_speculative_tokens"]
    runner.use_pp = runner.is_last_pp_rank = False
    for name in ("pcp_manager", "adaptive_verification", "fast_prefill", "pooling_runner",
                 "pp_handler", "encoder_cache", "prompt_logprobs_worker", "sampler",
                 "kv_block_zeroer"):
        setattr(runner, name, None)
    runner.model_config = SimpleNamespace(rswa_window=None)
    runner.model_state, runner.block_tables, runner.lora_state = _ModelState(), _BlockTables(), _LoraState()
    runner.req_states = RequestState(**_kwargs(
        RequestState, max_num_reqs=CONFIG["max_num_reqs"], max_model_len=CONFIG["max_model_len"],
        max_num_batched_tokens=CONFIG["max_num_batched_tokens"],
        num_speculative_steps=CONFIG["num_speculative_tokens"], vocab_size=VOCAB, device=DEVICE))
    runner.input_buffers = new_buffers()
    return runner


def new_buffers():
    return InputBuffers(max_num_reqs=CONFIG["max_num_reqs"],
                        max_num_tokens=CONFIG["max_num_batched_tokens"], device=DEVICE)


def pcp_managers():
    if CONFIG["pcp_size"] <= 1:
        return []
    from vllm.v1.worker.gpu.pcp_manager import PCPManager
    return [PCPManager(**_kwargs(
        PCPManager, pcp_world_size=CONFIG["pcp_size"], pcp_rank=rank, device=DEVICE,
        shard_decode_requests=CONFIG["shard_decode_requests"], max_num_reqs=CONFIG["max_num_reqs"],
        max_num_tokens=CONFIG["max_num_batched_tokens"], dcp_world_size=CONFIG["dcp_size"], dcp_rank=0))
        for rank in range(CONFIG["pcp_size"])]


def scheduler_output(step):
    """One step as this release's SchedulerOutput (built by keyword)."""
    new = []
    for r in step["new_requests"]:
        head = r["token_ids"] or [synth_token(r["id"], p) for p in range(r["prompt_len"])]
        ids = head + [synth_token(r["id"], p) for p in range(len(head), r["prefill_len"])]
        new.append(_build(
            sched.NewRequestData, req_id=r["id"], prompt_token_ids=ids[:r["prompt_len"]],
            mm_features=[], sampling_params=SamplingParams(max_tokens=r["max_tokens"]),
            pooling_params=None, block_ids=(list(r["block_ids"]),),
            num_computed_tokens=r["num_computed_tokens"], lora_request=None, prefill_token_ids=ids))
    cached = step["cached"]
    cached_data = _build(
        sched.CachedRequestData, req_ids=[c["id"] for c in cached],
        resumed_req_ids={c["id"] for c in cached if c["resumed"]}, new_token_ids=[[] for _ in cached],
        all_token_ids={}, num_computed_tokens=[c["num_computed_tokens"] for c in cached],
        new_block_ids=[None if c["new_block_ids"] is None else (list(c["new_block_ids"]),) for c in cached],
        num_output_tokens=[0 for _ in cached])
    nst = step["num_scheduled_tokens"]
    return _build(
        sched.SchedulerOutput, scheduled_new_reqs=new, scheduled_cached_reqs=cached_data,
        num_scheduled_tokens=dict(nst), total_num_scheduled_tokens=sum(nst.values()),
        scheduled_spec_decode_tokens={k: [-1] * n for k, n in step["spec_tokens"].items() if n},
        scheduled_encoder_inputs={}, finished_req_ids=set(step["finished"]), free_encoder_mm_hashes=[],
        preempted_req_ids=set(step["preempted"]) or None)


class Replay:
    """Feeds the steps through the runner in execute_model's order; ``run`` returns
    what each stage built: gather (BatchReqState), prepare and dummy (InputBatch),
    partition (one rank-local InputBatch per PCP rank)."""

    def __init__(self):
        self.runner, self.managers, self.dummy_buffers = make_runner(), pcp_managers(), new_buffers()

    def call(self, stage, fn, *args):
        """Run one real call; an exception is a failure unless the class expects it."""
        try:
            return fn(*args)
        except Exception as exc:
            if CLASS["expected_raise"] and CLASS["stage"] == stage:
                raise
            pytest.fail(f"step {self.index}: {STAGE_CALL[stage]} raised {type(exc).__name__}: {exc} "
                        "on scheduler output that keeps the scheduler's contract")

    def run(self, index, step):
        self.index, runner, out = index, self.runner, {}
        so = scheduler_output(step)
        self.call("lifecycle", lambda: (runner.finish_requests(so), runner.add_requests(so),
                                        runner.update_requests(so), self.write_drafts(step)))
        nst = step["num_scheduled_tokens"]
        if not nst:
            return out
        runner.pcp_manager = self.managers[0] if self.managers else None
        out["gather"] = self.call("gather", runner.gather_batch_req_state, so, False)[0]
        runner.pcp_manager = None
        desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=sum(nst.values()),
                                        num_reqs=None)  # eager: no padding
        extra = [0] if "num_active_loras" in inspect.signature(runner.prepare_inputs).parameters else []
        batch = out["prepare"] = self.call("prepare", runner.prepare_inputs, so, out["gather"], desc, *extra)
        if self.managers:
            by_desc = "batch_desc" in inspect.signature(self.managers[0].partition_batch).parameters
            out["partition"] = [self.call("partition", m.partition_batch, batch, *((desc,) if by_desc
                                          else (None, None))) for m in self.managers]
        self.call("postprocess", self.sample, step, batch)
        out["dummy"] = self.call("dummy", InputBatch.make_dummy, len(nst), sum(nst.values()),
                                 self.dummy_buffers)
        return out

    def write_drafts(self, step):
        """Drafter stand-in: accepted drafts are the target's tokens, rejected ones differ."""
        states = self.runner.req_states
        for req_id, k in step["spec_tokens"].items():
            idx = states.req_id_to_index.get(req_id)
            if idx is None or k <= 0:
                continue
            first = int(states.num_computed_tokens_np[idx]) + step["num_scheduled_tokens"].get(req_id, 0) - k
            bad = k - min(step["rejected"].get(req_id, 0), k)
            ids = [(synth_token(req_id, first + j) + (j >= bad)) % VOCAB for j in range(k)]
            states.draft_tokens[idx, :k] = torch.tensor(ids, dtype=states.draft_tokens.dtype)

    def sample(self, step, batch):
        """Sampler stand-in, then the real postprocess_sampled (advances the runner's state)."""
        n = batch.num_reqs
        num_logits = np.diff(batch.cu_num_logits_np[: n + 1]).astype(np.int32)
        seq_lens = batch.seq_lens[:n].cpu().numpy()
        sampled = np.zeros((n, max(int(num_logits.max()), 1)), dtype=np.int64)
        num_sampled = num_logits.copy()
        for i, req_id in enumerate(batch.req_ids):
            first = int(seq_lens[i]) - int(num_logits[i]) + 1
            sampled[i, : num_logits[i]] = [synth_token(req_id, first + j) for j in range(int(num_logits[i]))]
            num_sampled[i] -= min(step["rejected"].get(req_id, 0), int(num_logits[i]) - 1)
        ns, nr = get_num_sampled_and_rejected(
            torch.from_numpy(num_sampled).to(DEVICE), batch.seq_lens[:n], batch.cu_num_logits,
            batch.idx_mapping, self.runner.req_states.prefill_len.gpu)
        self.runner.postprocess_sampled(batch.idx_mapping, torch.from_numpy(sampled).to(DEVICE), ns, nr,
                                        batch.query_start_loc)


# ----------------------------------------------------------------- the property
STAGE_CALL = {"lifecycle": "GPUModelRunner.finish/add/update_requests",
              "gather": "GPUModelRunner.gather_batch_req_state",
              "prepare": "GPUModelRunner.prepare_inputs", "partition": "PCPManager.partition_batch",
              "postprocess": "GPUModelRunner.postprocess_sampled", "dummy": "InputBatch.make_dummy"}
WHO = {"gather": "gather_batch_req_state's", "prepare": "prepare_inputs'", "dummy": "make_dummy's",
       "partition": "partition_batch's"}


def dtype_of(value):
    if value is None:
        return "None"
    if value is ABSENT:
        return "absent"
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, np.ndarray):
        return f"numpy.{value.dtype}"
    return type(value).__name__


ABSENT = SimpleNamespace(dtype="absent")  # the release's object has no such field


def field_of(obj, name):
    for part in name.split("."):
        obj = getattr(obj, part, ABSENT)
        if obj is None or obj is ABSENT:
            return obj
    return obj


def none_allowed(step, batch):
    """The documented conditions under which the field may be None."""
    when = CLASS["none_when"]
    return (when == "no_prefill" and not getattr(batch, "has_prefill", False)) or \
        (when == "no_drafts" and not any(step["spec_tokens"].values())) or when == "feature_off"


def check(index, step, out):
    stage, name = CLASS["stage"], CLASS["field"]
    if stage not in out:
        return
    real = field_of(out["prepare"], name) if "prepare" in out else ABSENT
    targets = out[stage] if stage == "partition" else [out[stage]]
    for rank, obj in enumerate(targets):
        who = WHO[stage] + (f" (PCP rank {rank})" if stage == "partition" else "")
        value = field_of(obj, name)
        if CLASS["kind"] == "dtype_drift":
            if stage == "dummy" and real is not None and real is not ABSENT:
                assert dtype_of(value) == dtype_of(real), (
                    f"step {index}: make_dummy's {name} is {dtype_of(value)}, prepare_inputs' is "
                    f"{dtype_of(real)} (cudagraph capture and replay see different dtypes)")
            assert value is None or dtype_of(value) == CLASS["declared"], (
                f"step {index}: {who} {name} is {dtype_of(value)}, expected {CLASS['declared']}"
                + (f" (prepare_inputs' is {dtype_of(real)})" if stage == "dummy" else "")
                + f"; {CLASS['why']}")
        elif CLASS["kind"] == "missing_field":
            if stage == "dummy" and real is not ABSENT:
                assert (value is None) == (real is None), (
                    f"step {index}: make_dummy's {name} is {dtype_of(value)}, prepare_inputs' is "
                    f"{dtype_of(real)} (a graph captured on the dummy never sees this field)")
            elif not none_allowed(step, obj):
                assert value is not None and value is not ABSENT, (
                    f"step {index}: {who} {name} is {dtype_of(value)} where its "
                    f"documented meaning requires a value ({CLASS['why']})")


def test_@@TEST@@():
    replay = Replay()
    for index, step in enumerate(STEPS):
        try:
            out = replay.run(index, step)
        except Exception as exc:  # only the class's own stage lets one through (Replay.call)
            assert type(exc).__name__ == CLASS["exception_type"], (
                f"step {index}: {STAGE_CALL[CLASS['stage']]} raised {type(exc).__name__}: {exc}, "
                f"expected {CLASS['exception_type']}")
            return
        check(index, step, out)
    assert not CLASS["expected_raise"], (
        f"{STAGE_CALL[CLASS['stage']]} accepted the scheduler-contract violation silently: no "
        f"{CLASS['exception_type']} in {len(STEPS)} step(s) ({CLASS['why']})")
'''
