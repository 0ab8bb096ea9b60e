"""Strategies for runner configurations and cudagraph batch descriptors.

Defaults keep batches small: prepare_inputs costs ~20 ms + ~1.75 ms per
request on CPU (Triton interpreter), so max_num_reqs <= 8, tokens <= 128.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from simrig.step import CUDAGRAPH_MODES, SEPARATE_DECODE_MODES, KvGroup, RunnerConfig
from simrig.triton_libdevice.libdevice import LIBDEVICE_MEANINGS, called_in
from strategies._validate import check_choice, check_int, check_strategy

DESCRIPTOR_MODES = ("NONE", "PIECEWISE", "FULL")  # the runtime modes a descriptor carries


class CudagraphDescriptor(NamedTuple):
    """A cudagraph batch descriptor as plain data (vLLM's BatchExecutionDescriptor
    carries the same three facts):

        NONE       eager: num_tokens == actual tokens, num_reqs None
        PIECEWISE  tokens padded to a capture size, requests not padded (None)
        FULL       tokens and requests both padded to a captured shape
    """

    mode: str  # "NONE" | "PIECEWISE" | "FULL"
    num_tokens: int  # padded token count (>= actual)
    num_reqs: int | None  # padded request count, None when not padded


def capture_size_lists(max_num_batched_tokens: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Capture-size lists: () for the sizes vLLM's config derives, or 1-4 sizes within the budget."""
    check_int("max_num_batched_tokens", max_num_batched_tokens, minimum=1)
    return st.one_of(st.just(()), st.lists(st.integers(1, max_num_batched_tokens), min_size=1, max_size=4,
                                           unique=True).map(lambda xs: tuple(sorted(xs))))


def kv_group_lists(*, sliding_window: bool = True, max_window: int = 48
                   ) -> st.SearchStrategy[tuple[KvGroup, ...]]:
    """KV cache groups: 1-3 groups, the first full attention with the config's
    block size, the others full or (``sliding_window``) sliding-window, some
    with their own block size."""
    check_int("max_window", max_window, minimum=1)
    kinds = ("full", "sliding_window") if sliding_window else ("full",)

    @st.composite
    def build(draw) -> tuple[KvGroup, ...]:
        count = draw(st.integers(1, 3))
        groups = [KvGroup()]
        for _ in range(count - 1):
            kind = draw(st.sampled_from(kinds))
            window = draw(st.integers(1, max_window)) if kind == "sliding_window" else 0
            groups.append(KvGroup(kind, window, draw(st.sampled_from((0, 4, 8)))))
        return tuple(groups)

    return build()


@functools.lru_cache(maxsize=1)
def vllm_samplers_run_here() -> bool:
    """Whether the installed vLLM's own samplers run in Triton's CPU interpreter: where the
    interpreter answers every libdevice function its Gumbel kernel calls (0.30.0's
    ``tldevice.log1p``: ``simrig.triton_libdevice``). Read as text:
    vLLM is not imported here."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    gumbel = Path(list(spec.submodule_search_locations)[0]) / "v1/worker/gpu/sample/gumbel.py"
    if not gumbel.is_file():
        return False
    return called_in(gumbel.read_text(encoding="utf-8")) <= set(LIBDEVICE_MEANINGS)


def runner_configs(*, max_num_reqs: st.SearchStrategy[int] = st.integers(1, 8),
                   max_num_batched_tokens: st.SearchStrategy[int] = st.sampled_from((16, 32, 64, 128)),
                   max_model_len: st.SearchStrategy[int] = st.sampled_from((64, 128, 256)),
                   num_speculative_tokens: st.SearchStrategy[int] = st.integers(0, 3),
                   pcp_sizes: st.SearchStrategy[int] = st.sampled_from((1, 2, 4, 8)),
                   dcp_sizes: st.SearchStrategy[int] = st.sampled_from((1, 2)),
                   shard_decode_requests: st.SearchStrategy[bool] = st.booleans(),
                   block_size: st.SearchStrategy[int] = st.just(16),
                   cudagraph_modes: st.SearchStrategy[str] = st.just("NONE"),
                   varlen_decode: st.SearchStrategy[bool] = st.booleans(),
                   dcp_without_pcp: st.SearchStrategy[bool] = st.booleans(),
                   max_loras: st.SearchStrategy[int] = st.sampled_from((0, 0, 0, 1, 2, 3)),
                   specialize_lora: st.SearchStrategy[bool] = st.booleans(),
                   multi_kv_groups: st.SearchStrategy[bool] = st.booleans(),
                   kv_groups: st.SearchStrategy[tuple[KvGroup, ...]] | None = None,
                   rejection_samplers: st.SearchStrategy[str] | None = None,
                   pp_sizes: st.SearchStrategy[int] = st.sampled_from((1, 1, 2)),
                   num_ubatches: st.SearchStrategy[int] = st.sampled_from((1, 2, 2, 3)),
                   ubatch_thresholds: st.SearchStrategy[int] = st.integers(0, 12),
                   ) -> st.SearchStrategy[RunnerConfig]:
    """``simrig.step.RunnerConfig`` values. Every argument is a strategy.

    ``max_num_batched_tokens`` is raised to at least ``max_num_reqs`` (a
    scheduler budget below one token per request slot is not a configuration
    vLLM accepts); ``dcp_size`` is drawn with PCP > 1, and with PCP 1 where
    ``dcp_without_pcp`` draws True (vLLM's ``ParallelConfig``: with PCP 1,
    "DCP reuses the TP ranks"); under PCP a DCP size drawn > 1 becomes the PCP
    size (``ParallelConfig`` accepts only DCP 1, PCP or TP x PCP there, and the
    rig runs TP 1: DCP 2 with PCP 4 or 8 is refused by vLLM), and
    ``shard_decode_requests`` only with PCP > 1 and DCP 1 (vLLM's
    ``ParallelConfig.pcp_shard_decode_requests``: DCP needs every decode on
    every rank). ``cudagraph_modes`` draws vLLM's cudagraph mode (a FULL draw
    under PCP > 1 becomes FULL_AND_PIECEWISE: PCP refuses mixed FULL graphs);
    a graph mode also draws its capture sizes (``capture_size_lists``) and,
    for the separate-routine modes, ``varlen_decode``. ``max_loras`` draws
    LoRA last (0: off, half the draws by default), so the fields before it
    come from the same choices with or without it; with LoRA on,
    ``specialize_lora`` draws vLLM's two graph-specialization switches
    (``LoRAConfig.specialize_active_lora``,
    ``CompilationConfig.cudagraph_specialize_lora``). ``pp_sizes`` draws the
    pipeline-parallel world last (a third of the draws PP 2 by default).
    The KV cache groups are one full-attention group unless
    ``multi_kv_groups`` draws True (then ``kv_group_lists()``, without
    sliding-window groups under PCP or DCP: vLLM's sliding-window manager
    supports neither) or ``kv_groups`` draws them. With drafts, ``rejection_samplers``
    draws last which rejection sampler verifies them (``simrig.step.REJECTION_SAMPLERS``:
    the greedy stand-in, or vLLM's own with standard or block verification; by default
    vLLM's own only where ``vllm_samplers_run_here()``).
    supports neither) or ``kv_groups`` draws them. ``num_ubatches`` draws
    micro-batching (DBO) after everything else, kept where PCP and DCP are 1 and
    the mode is not PIECEWISE, and with it drafts and LoRA turned off (vLLM
    refuses DBO with any of them: ``VllmConfig._get_dbo_unsupported_features``); ``ubatch_thresholds`` draws
    each threshold as ``num_ubatches`` plus a small number, so small batches split.
    """
    if rejection_samplers is None:
        rejection_samplers = st.sampled_from(("", "", "standard", "block") if vllm_samplers_run_here()
                                             else ("",))
    args = dict(max_num_reqs=max_num_reqs, max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len, num_speculative_tokens=num_speculative_tokens,
                pcp_sizes=pcp_sizes, dcp_sizes=dcp_sizes,
                shard_decode_requests=shard_decode_requests, block_size=block_size,
                cudagraph_modes=cudagraph_modes, varlen_decode=varlen_decode,
                dcp_without_pcp=dcp_without_pcp, max_loras=max_loras,
                specialize_lora=specialize_lora, multi_kv_groups=multi_kv_groups,
                rejection_samplers=rejection_samplers, pp_sizes=pp_sizes,
                num_ubatches=num_ubatches, ubatch_thresholds=ubatch_thresholds)
    for name, value in args.items():
        check_strategy(name, value)
    if kv_groups is not None:
        check_strategy("kv_groups", kv_groups)

    @st.composite
    def build(draw) -> RunnerConfig:
        reqs = draw(max_num_reqs)
        pcp = draw(pcp_sizes)
        dcp = draw(dcp_sizes) if pcp > 1 or draw(dcp_without_pcp) else 1
        if pcp > 1 and dcp > 1:
            # vLLM's ParallelConfig refuses any other DCP size under PCP: "When PCP is
            # enabled, DCP must be disabled, span the PCP axis, or span the full TP x PCP
            # axis" (vllm/config/parallel.py, ``dcp not in (1, pcp, tp * pcp)``, 0.30.0
            # to 0.33.0). The rig runs TP 1, so a DCP drawn under PCP spans the PCP axis.
            dcp = pcp
        budget = max(draw(max_num_batched_tokens), reqs)
        mode = draw(cudagraph_modes)
        if mode not in CUDAGRAPH_MODES:
            raise InvalidArgument(f"cudagraph_modes drew {mode!r}; modes are {', '.join(CUDAGRAPH_MODES)}")
        if pcp > 1 and mode == "FULL":
            mode = "FULL_AND_PIECEWISE"
        sizes = draw(capture_size_lists(budget)) if mode != "NONE" else ()
        varlen = draw(varlen_decode) if mode in SEPARATE_DECODE_MODES else False
        config = RunnerConfig(
            max_num_reqs=reqs,
            max_num_batched_tokens=budget,
            cudagraph_mode=mode, capture_sizes=sizes, varlen_decode=varlen,
            max_model_len=draw(max_model_len),
            num_speculative_tokens=draw(num_speculative_tokens),
            pcp_size=pcp,
            dcp_size=dcp,
            shard_decode_requests=draw(shard_decode_requests) if pcp > 1 and dcp == 1 else False,
            block_size=draw(block_size),
            kv_groups=draw(kv_groups) if kv_groups is not None
            else draw(kv_group_lists(sliding_window=pcp == 1 and dcp == 1)) if draw(multi_kv_groups)
            else (KvGroup(),))
        loras = draw(max_loras)
        if loras:
            config = replace(config, max_loras=loras, specialize_active_lora=draw(specialize_lora),
                             cudagraph_specialize_lora=draw(specialize_lora))
        if config.num_speculative_tokens:
            config = replace(config, rejection_sampler=draw(rejection_samplers))
        n = draw(num_ubatches)
        if n > 1 and config.pcp_size == 1 and config.dcp_size == 1 and config.cudagraph_mode != "PIECEWISE":
            # drafts and LoRA are dropped for it (the PCP axis keeps its draws)
            config = replace(config, num_ubatches=n, num_speculative_tokens=0, rejection_sampler="", max_loras=0,
                             specialize_active_lora=False, cudagraph_specialize_lora=True,
                             dbo_decode_token_threshold=n + draw(ubatch_thresholds),
                             dbo_prefill_token_threshold=n + draw(ubatch_thresholds))
        pp = draw(pp_sizes)
        if pp > 1 and config.num_ubatches == 1:  # vLLM refuses micro-batching with PP
            config = replace(config, pp_size=pp)
        config.validate()  # a strategy argument produced an impossible value
        return config

    return build()


def cudagraph_descriptors(num_tokens: int, num_reqs: int, *,
                          modes: tuple[str, ...] = DESCRIPTOR_MODES,
                          max_padding: int = 64) -> st.SearchStrategy[CudagraphDescriptor]:
    """A descriptor a runner could dispatch a batch of ``num_tokens`` tokens and
    ``num_reqs`` requests to; padded counts never fall below the actual ones."""
    check_int("num_tokens", num_tokens, minimum=1)
    check_int("num_reqs", num_reqs, minimum=1, maximum=num_tokens)
    check_int("max_padding", max_padding, minimum=0)
    if not modes:
        raise InvalidArgument("modes=() must name at least one mode")
    for mode in modes:
        check_choice("modes", mode, DESCRIPTOR_MODES)

    @st.composite
    def build(draw) -> CudagraphDescriptor:
        mode = draw(st.sampled_from(modes))
        if mode == "NONE":
            return CudagraphDescriptor("NONE", num_tokens, None)
        tokens = num_tokens + draw(st.integers(0, max_padding))
        if mode == "PIECEWISE":
            return CudagraphDescriptor("PIECEWISE", tokens, None)
        reqs = num_reqs + draw(st.integers(0, max(0, min(max_padding, tokens - num_reqs))))
        return CudagraphDescriptor("FULL", tokens, reqs)

    return build()
