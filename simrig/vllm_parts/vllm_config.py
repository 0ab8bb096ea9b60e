"""vLLM's own ``VllmConfig`` for a trace config: where capture sizes and PCP options come from.

``vllm_config_for`` builds the object a worker builds its runner from, out of the trace's
``RunnerConfig``, and lets vLLM's own config code decide what the runner would run with (its
docstring tables which config part decides what). Each is cached per ``config_key`` and
must be treated as read-only. See docs/cudagraph.md.
"""

from __future__ import annotations

from typing import Any

from simrig.step import RunnerConfig
from simrig.vllm_parts.scheduler import _model_dir

_CONFIGS: dict[tuple, Any] = {}
# A campaign draws many configs; the oldest are dropped past this many.
_MAX_CACHED = 256


def config_key(config: RunnerConfig) -> tuple:
    """The trace-config fields a VllmConfig is built from (the cache key)."""
    return (config.max_num_reqs, config.max_num_batched_tokens, config.max_model_len,
            config.num_speculative_tokens, config.pcp_size, config.cudagraph_mode, tuple(config.capture_sizes),
            config.pp_size)


def vllm_config_for(config: RunnerConfig) -> Any:
    """vLLM's VllmConfig for ``config`` (cached; read-only), its capture sizes
    decided by vLLM's ``VllmConfig._set_cudagraph_sizes`` and the runner's
    ``resolve_cudagraph_mode_and_sizes``.

    A worker builds its runner from a ``VllmConfig``; simrig builds the same kind
    of object from the trace's ``RunnerConfig`` and lets vLLM's own config code
    decide what the runner would run with:

        trace config (RunnerConfig)          VllmConfig part          decided by vLLM
        ───────────────────────────          ───────────────          ───────────────
        max_num_reqs, max_num_batched_       SchedulerConfig          max_num_seqs, token budget
          tokens, max_model_len
        cudagraph_mode, capture_sizes        CompilationConfig        cudagraph_capture_sizes (the
          (() = not named)                                            trace's, else the default
                                                                      list), max_cudagraph_capture_size
        num_speculative_tokens > 0           SpeculativeConfig        uniform_decode_query_len, the
                                                                      decode sizes added to the list
        pcp_size (not dcp_size: see          ParallelConfig           PCP manager options (expert
          _parallel_config), pp_size                                  parallelism, KV interleave),
                                                                      pipeline_parallel_size

    The model is the tiny llama config the recorder uses (no weights are read).
    The first ``VllmConfig`` of a process costs about half a second, later ones a
    few milliseconds; campaigns build many harnesses, so each is cached per
    config key and must be treated as read-only.
    """
    key = config_key(config)
    if key not in _CONFIGS:
        try:
            built = _build(config)
        except ValueError as exc:  # pydantic's ValidationError too: vLLM refuses the config
            raise ValueError(f"config: vLLM's {_refusal(exc)}") from None
        if len(_CONFIGS) >= _MAX_CACHED:
            del _CONFIGS[next(iter(_CONFIGS))]
        _CONFIGS[key] = built
    return _CONFIGS[key]


def _refusal(exc: ValueError) -> str:
    """One line for vLLM's refusal: the config class and its first message."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and errors():
        message = str(errors()[0].get("msg", "")).removeprefix("Value error, ")
        return f"{getattr(exc, 'title', 'config')} refuses it: {message.splitlines()[0]}"
    lines = str(exc).splitlines()
    return f"config refuses it: {lines[0] if lines else type(exc).__name__}"


def capture_sizes_for(config: RunnerConfig) -> tuple[int, ...]:
    """The capture sizes vLLM's config derives for ``config`` (() in eager mode)."""
    return tuple(vllm_config_for(config).compilation_config.cudagraph_capture_sizes)


def _build(config: RunnerConfig) -> Any:
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.config import (
        CompilationConfig,
        CUDAGraphMode,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )


    model_dir = str(_model_dir())
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32",
                        max_model_len=config.max_model_len)
    scheduler = SchedulerConfig(max_num_seqs=config.max_num_reqs,
                                max_num_batched_tokens=config.max_num_batched_tokens,
                                max_model_len=config.max_model_len, is_encoder_decoder=False)
    parallel = _parallel_config(ParallelConfig, config.pcp_size, config.pp_size)
    speculative = None
    if config.num_speculative_tokens > 0:
        # The drafter is a stand-in; the config needs a method every MRV2 release
        # accepts (0.30/0.31 refuse ngram under MRV2): EAGLE with the tiny llama
        # as its draft model, never loaded.
        speculative = SpeculativeConfig(
            method="eagle", model=model_dir, num_speculative_tokens=config.num_speculative_tokens,
            target_model_config=model, target_parallel_config=parallel)
    vllm_config = VllmConfig(model_config=model, scheduler_config=scheduler, parallel_config=parallel,
                             speculative_config=speculative,
                             compilation_config=CompilationConfig(cudagraph_mode=config.cudagraph_mode))
    # A platform without static graphs (the CPU one) turns cudagraph_mode to NONE
    # and empties the sizes in VllmConfig.__post_init__; simrig dispatches as a
    # CUDA worker would, so the trace's mode is set again and vLLM's own sizing
    # runs on it: "If users explicitly specify cudagraph capture sizes in the
    # compilation config, those will override this default logic"
    # (VllmConfig._set_cudagraph_sizes).
    compilation = vllm_config.compilation_config
    compilation.cudagraph_mode = getattr(CUDAGraphMode, config.cudagraph_mode)
    compilation.cudagraph_capture_sizes = list(config.capture_sizes) or None
    compilation.max_cudagraph_capture_size = None
    vllm_config._set_cudagraph_sizes()
    _resolve_as_the_runner_does(compilation, config)
    return vllm_config


def _resolve_as_the_runner_does(compilation: Any, config: RunnerConfig) -> None:
    """GPUModelRunner.initialize_kv_cache's ``resolve_cudagraph_mode_and_sizes``
    (same keywords on 0.30-0.33), with attention that supports every graph: the
    attention builders are stand-ins, the trace's mode is the one to run."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.attention.backend import AttentionCGSupport

    compilation.resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport.ALWAYS, None, config.decode_query_len, use_v2_model_runner=True,
        max_num_reqs=config.max_num_reqs, piecewise_capture_available=True)


def _parallel_config(cls: Any, pcp_size: int, pp_size: int = 1) -> Any:
    """ParallelConfig for one TP rank with the trace's PCP and PP sizes.

    The DCP size is not given to vLLM's config: with one TP rank and the tiny
    GQA model vLLM refuses DCP > 1 ("Decode context parallelism for GQA/MQA
    requires `--tensor-parallel-size` (1) to be greater than the model's total
    number of KV heads"), and nothing simrig reads from the parallel config
    depends on it (the PCP managers and block tables take the trace's DCP size).
    """
    return cls(prefill_context_parallel_size=pcp_size, pipeline_parallel_size=pp_size)
