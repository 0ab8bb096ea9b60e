"""vLLM adapter for the scheduler side: the real v1 ``Scheduler``, offline.

One of the rooms that may import vllm (see ``simrig.vllm_parts``); everything around it
(workloads, the synthetic sampler, the record loop, the live recorder) speaks simrig's own
types. ``RealScheduler`` drives the real Scheduler step by step (its docstring maps each of
its methods to vLLM's); ``step_from_output`` converts a SchedulerOutput into a Step right
after ``schedule()``. Sampling parameters cross through two mappings handed in from above
(``simrig.vllm_sampling`` stands on this room's floor). See docs/recording.md.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, replace
from importlib.metadata import version
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simrig.sampling.params import SamplingSpec
from simrig.step import SYNTH_VOCAB_SIZE, CachedUpdate, NewRequest, RunnerConfig, Step, synth_token
from simrig.vllm_parts.lora import lora_request
from simrig.vllm_runtime import platform

# A token id synth_token never produces: the synthetic sampler emits it to stop
# a request early (vLLM's stop_token_ids path, the same check EOS takes).
STOP_TOKEN_ID = SYNTH_VOCAB_SIZE

# The smallest llama that vLLM's config machinery accepts; weights are never loaded.
_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": SYNTH_VOCAB_SIZE + 64, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1 << 20, "torch_dtype": "float32",
}
_NUM_KV_HEADS, _HEAD_SIZE = 2, 16


@dataclass(frozen=True)
class SchedulerSetup:
    """What simrig asks of vLLM's scheduler (vLLM-agnostic knobs)."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    max_model_len: int = 2048
    num_kv_blocks: int = 256  # small -> preemption
    prefix_caching: bool = True
    num_speculative_tokens: int = 0  # > 0: ngram speculative config, drafts scheduled
    pcp_size: int = 1
    block_size: int = 16
    max_loras: int = 0  # > 0: LoRA on (LoRAConfig.max_loras: "Max number of LoRAs in a single batch")

    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(max_num_reqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens,
                            max_model_len=self.max_model_len,
                            num_speculative_tokens=self.num_speculative_tokens,
                            pcp_size=self.pcp_size, block_size=self.block_size,
                            max_loras=self.max_loras)


def _vllm() -> Any:
    """Import the scheduler-side vLLM names (platform first, as everywhere)."""
    platform.configure()
    import vllm  # noqa: F401

    platform.apply_after_import()
    # lazy: vllm and torch load after platform.configure() sets the env
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    return dict(torch=torch, EngineArgs=EngineArgs, SamplingParams=SamplingParams,
                resolve_kv_cache_block_sizes=resolve_kv_cache_block_sizes, Scheduler=Scheduler,
                FullAttentionSpec=FullAttentionSpec, KVCacheConfig=KVCacheConfig,
                KVCacheGroupSpec=KVCacheGroupSpec, DraftTokenIds=DraftTokenIds,
                ModelRunnerOutput=ModelRunnerOutput, Request=Request,
                StructuredOutputManager=StructuredOutputManager)


def vllm_version() -> str:
    return version("vllm")


def _model_dir() -> Path:
    root = Path(os.environ.get("SIMRIG_CACHE", Path.cwd() / ".cache")) / "tiny-llama"
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.json"
    text = json.dumps(_TINY_LLAMA, indent=1)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return root


# Creating an engine config costs ~9 s cold; share them per process.
_CONFIGS: dict[tuple, Any] = {}


def engine_config(setup: SchedulerSetup) -> Any:
    """vLLM's VllmConfig for ``setup`` (cached; treat as read-only)."""
    key = tuple(sorted(asdict(setup).items()))
    if key not in _CONFIGS:
        v = _vllm()
        spec = None
        if setup.num_speculative_tokens > 0:
            # ngram needs no draft model; the scheduler only sees draft ids.
            spec = {"method": "ngram", "num_speculative_tokens": setup.num_speculative_tokens,
                    "prompt_lookup_max": 3, "prompt_lookup_min": 2}
        args = v["EngineArgs"](
            model=str(_model_dir()), skip_tokenizer_init=True, load_format="dummy",
            dtype="float32", max_model_len=setup.max_model_len, max_num_seqs=setup.max_num_seqs,
            max_num_batched_tokens=setup.max_num_batched_tokens, block_size=setup.block_size,
            enforce_eager=True, enable_prefix_caching=setup.prefix_caching,
            enable_chunked_prefill=True, speculative_config=spec,
            prefill_context_parallel_size=setup.pcp_size,
            # the scheduler only reads the adapter ids (no adapter is ever loaded)
            **({"enable_lora": True, "max_loras": setup.max_loras} if setup.max_loras else {}))
        _CONFIGS[key] = args.create_engine_config()
    return _CONFIGS[key]


class RealScheduler:
    """One real vLLM Scheduler, driven step by step.

    Together with ``simrig.adapters.runner`` this is the adapter layer, one of the
    rooms that touch vllm (see ``simrig.vllm_parts``). Everything around it (workloads, the synthetic
    sampler, the record loop, the live recorder) speaks simrig's own types.

        SchedulerSetup ──► engine config (tiny llama config.json, dummy weights,
                           no tokenizer) + hand-made KVCacheConfig (num_kv_blocks)
                       ──► vllm.v1.core.sched.scheduler.Scheduler (real)

        RealScheduler.add(WorkloadRequest)       Scheduler.add_request(Request)
        RealScheduler.schedule() -> (Step, so)   Scheduler.schedule()
        RealScheduler.complete(so, sampled)      Scheduler.update_from_output(ModelRunnerOutput)
        RealScheduler.propose_drafts(drafts)     Scheduler.update_draft_token_ids(DraftTokenIds)

    ``step_from_output`` converts a SchedulerOutput into a Step right after
    ``schedule()``: NewRequestData.prefill_token_ids is the request's live token
    list, which grows once outputs are appended.

    ``params_of(SamplingParams, spec, max_tokens)`` makes a request's SamplingParams from
    its spec and ``spec_of(params)`` reads one back for its Step (``simrig.vllm_sampling``'s
    mappings); without them every request runs under vLLM's defaults and no Step carries one.
    """

    def __init__(self, setup: SchedulerSetup, *, params_of: Callable[..., Any] | None = None,
                 spec_of: Callable[[Any], SamplingSpec | None] | None = None):
        v = self._v = _vllm()
        self.setup = setup
        self._params_of, self._spec_of = params_of, spec_of
        self._live: set[str] = set()  # ids the runner holds (streaming updates re-send one)
        config = copy.deepcopy(engine_config(setup))  # the scheduler mutates cache_config
        torch = v["torch"]
        layers = [f"model.layers.{i}.self_attn.attn" for i in range(_TINY_LLAMA["num_hidden_layers"])]
        spec = v["FullAttentionSpec"](block_size=setup.block_size, num_kv_heads=_NUM_KV_HEADS,
                                      head_size=_HEAD_SIZE, dtype=torch.float32)
        kv = v["KVCacheConfig"](num_blocks=setup.num_kv_blocks, kv_cache_tensors=[],
                                kv_cache_groups=[v["KVCacheGroupSpec"](layers, spec)])
        config.cache_config.num_gpu_blocks = setup.num_kv_blocks
        block_size, hash_block_size = v["resolve_kv_cache_block_sizes"](kv, config)
        self.block_hasher = None
        if setup.prefix_caching:
            # The engine core hands every request this hasher; without it the
            # prefix cache never hits.
            from vllm.utils.hashing import get_hash_fn_by_name

            # lazy: vllm loads after platform.configure() sets its env
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.block_hasher = get_request_block_hasher(
                hash_block_size, hash_fn, config.num_hash_lookahead_tokens)
        self.scheduler = v["Scheduler"](
            vllm_config=config, kv_cache_config=kv,
            structured_output_manager=v["StructuredOutputManager"](config),
            block_size=block_size, hash_block_size=hash_block_size, log_stats=False)
        if not self.scheduler.use_v2_model_runner:
            raise RuntimeError("vLLM scheduler is not in Model Runner V2 mode "
                               "(VLLM_USE_V2_MODEL_RUNNER=1 must be set before vllm is imported)")

    # ------------------------------------------------------------------ driving
    def add(self, req_id: str, prompt_token_ids: list[int], max_tokens: int,
            arrival_s: float = 0.0, lora_id: int | None = None, resumable: bool = False,
            sampling: SamplingSpec | None = None) -> None:
        """A request; ``resumable``: a streaming-input session (adding the same id again
        sends its next input, vLLM's ``Scheduler.add_request`` with a live id); ``sampling``:
        its parameters (needs ``params_of``), the recorder's stop id added to its stop ids."""
        if sampling is not None:
            if self._params_of is None:
                raise ValueError(f"{req_id}: sampling parameters need a RealScheduler built with params_of")
            sampling = replace(sampling, stop_token_ids=(*sampling.stop_token_ids, STOP_TOKEN_ID))
            params = self._params_of(self._v["SamplingParams"], sampling, max_tokens)
            params.ignore_eos = True
        else:
            params = self._v["SamplingParams"](max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN_ID],
                                               ignore_eos=True)
        extra = {"resumable": True} if resumable else {}
        self.scheduler.add_request(self._v["Request"](
            request_id=req_id, prompt_token_ids=list(prompt_token_ids), sampling_params=params,
            pooling_params=None, arrival_time=arrival_s, block_hasher=self.block_hasher,
            lora_request=lora_request(lora_id), **extra))

    def schedule(self) -> tuple[Step, Any]:
        so = self.scheduler.schedule()
        return step_from_output(so, live=self._live, spec_of=self._spec_of), so

    def progress(self, req_id: str) -> tuple[int, int] | None:
        """(num_computed_tokens, num_tokens) of a live request, else None."""
        req = self.scheduler.requests.get(req_id)
        if req is None or req.is_finished():
            return None
        return req.num_computed_tokens, req.num_tokens

    def complete(self, so: Any, sampled: dict[str, list[int]]) -> None:
        """Feed one step's sampled tokens back (a ModelRunnerOutput)."""
        ids = list(so.num_scheduled_tokens)
        out = self._v["ModelRunnerOutput"](
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[list(sampled.get(r, ())) for r in ids])
        self.scheduler.update_from_output(so, out)

    def propose_drafts(self, drafts: dict[str, list[int]]) -> None:
        """The drafter's proposals, as the sync engine core hands them over."""
        if drafts:
            self.scheduler.update_draft_token_ids(
                self._v["DraftTokenIds"](list(drafts), [list(d) for d in drafts.values()]))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_requests()


# --------------------------------------------------------------- conversion
def _group0(block_ids: Any) -> list[int]:
    """Block ids of the single KV cache group (tuple of per-group lists)."""
    if not block_ids:
        return []
    return list(block_ids[0])


def step_from_output(so: Any, *, keep_token_ids: bool = True, live: set[str] | None = None,
                     spec_of: Callable[[Any], SamplingSpec | None] | None = None) -> Step:
    """A vLLM SchedulerOutput as a simrig Step (lengths, ids, blocks, drafts).

    ``live``: the ids the runner holds before this output, updated in place; a
    new request whose id is still held (not finished or preempted by this
    output) is a streaming-input update (``NewRequest.streaming``: the
    scheduler re-sends a resumable session with its next input).

    Prompt token ids are kept only where they differ from synth_token (shared
    prefixes), so a replay reproduces them; ``keep_token_ids=False`` never
    writes them (the live recorder keeps user prompts out of traces). ``spec_of`` reads each
    new request's SamplingParams into its ``sampling`` (without it: none).
    """
    new = []
    if live is not None:
        live.difference_update(so.finished_req_ids, so.preempted_req_ids or ())
    for r in so.scheduled_new_reqs:
        prompt = list(r.prompt_token_ids or [])
        prefill = r.prefill_token_ids if r.prefill_token_ids is not None else prompt
        explicit = None
        if keep_token_ids and any(t != synth_token(r.req_id, p) for p, t in enumerate(prompt)):
            explicit = prompt
        max_tokens = getattr(r.sampling_params, "max_tokens", None) or 16
        new.append(NewRequest(
            req_id=r.req_id, prompt_len=len(prompt), num_computed_tokens=r.num_computed_tokens,
            max_tokens=max_tokens,
            prefill_len=len(prefill) if len(prefill) != len(prompt) else None,
            prompt_token_ids=explicit, block_ids=_group0(r.block_ids),
            # the request's adapter (LoRARequest.lora_int_id); None: the base model
            lora_id=r.lora_request.lora_int_id if getattr(r, "lora_request", None) else None,
            streaming=live is not None and r.req_id in live,
            sampling=spec_of(r.sampling_params) if spec_of is not None else None))
    if live is not None:
        live.update(r.req_id for r in so.scheduled_new_reqs)
    c = so.scheduled_cached_reqs
    cached = [CachedUpdate(req_id=rid, num_computed_tokens=c.num_computed_tokens[i],
                           new_block_ids=None if c.new_block_ids[i] is None
                           else _group0(c.new_block_ids[i]),
                           resumed=rid in c.resumed_req_ids)
              for i, rid in enumerate(c.req_ids)]
    spec = {rid: len(ids) for rid, ids in so.scheduled_spec_decode_tokens.items() if ids}
    return Step(new_requests=new, cached=cached,
                num_scheduled_tokens=dict(so.num_scheduled_tokens), spec_tokens=spec,
                finished=sorted(so.finished_req_ids),
                preempted=sorted(so.preempted_req_ids or ()))


def rejected_from_output(so: Any, model_runner_output: Any) -> dict[str, int]:
    """Drafts the sampler rejected, per request, as update_from_output counts them."""
    out: dict[str, int] = {}
    sampled = model_runner_output.sampled_token_ids
    index = model_runner_output.req_id_to_index
    for rid, drafts in so.scheduled_spec_decode_tokens.items():
        if not drafts or rid not in index or not sampled:
            continue
        generated = sampled[index[rid]]
        if len(generated):
            out[rid] = max(len(drafts) - (len(generated) - 1), 0)
    return out


def runner_config_of(scheduler: Any) -> RunnerConfig:
    """The RunnerConfig matching a live Scheduler's vLLM config."""
    cfg = scheduler.vllm_config
    return RunnerConfig(
        max_num_reqs=cfg.scheduler_config.max_num_seqs,
        max_num_batched_tokens=cfg.scheduler_config.max_num_batched_tokens,
        max_model_len=cfg.model_config.max_model_len,
        num_speculative_tokens=cfg.num_speculative_tokens,
        pcp_size=cfg.parallel_config.prefill_context_parallel_size,
        dcp_size=cfg.parallel_config.decode_context_parallel_size,
        block_size=cfg.cache_config.block_size,
        max_loras=cfg.lora_config.max_loras if getattr(cfg, "lora_config", None) else 0)


def scheduler_class() -> Any:
    """The installed Scheduler class, imported as-is (the live hook runs
    inside a user's vLLM process: no platform changes there)."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler
