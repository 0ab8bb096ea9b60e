"""Stand-ins for the runner's collaborators that need a model or a GPU.

``GPUModelRunner.execute_model`` runs for real; ``ModelStandIn`` (the model forward),
``ModelStateStandIn`` (attention metadata builders), ``LoraManagerStandIn`` (the
worker's LoRA manager) and ``FullGraphReplay`` (``CudaGraphManager.run_fullgraph``)
take the place of what has no CPU form without a loaded model. None computes an
argument for vLLM: they accept what the real code hands them and return correctly
shaped outputs.

See docs/standins.md for each stand-in and its reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from simrig.vllm_sampling.token_names import TokenNames

HIDDEN_SIZE = 8  # the stand-in model's hidden size: at least token_names' 3 columns
_NO_NAMES = SimpleNamespace(on_inputs=lambda *args: None)  # a model without names (the repro's)


class ModelStandIn:
    """The model forward: records what it was called with, returns hidden states of shape
    [num_tokens, HIDDEN_SIZE] (the padded batch) that name each token (``TokenNames``)."""

    def __init__(self, torch: Any, device: Any, vocab_size: int = 0, runner: Any = None) -> None:
        self._torch = torch
        self._device = device
        self.vocab_size = vocab_size
        self.names = TokenNames(torch, device, HIDDEN_SIZE, runner)  # hidden states name their tokens
        self.last_inputs: dict[str, Any] | None = None
        # the trace's token for each logit row of the batch being sampled
        # (set by the harness before sample_tokens) # [num_logits]
        self.target_tokens: Any = None
        self.spread_rows: dict[int, Any] | None = None  # row -> its spread logits, same time

    def modules(self) -> list[Any]:
        """A torch-compiled model, as PIECEWISE graphs require
        (cudagraph_utils.has_compiled_submodule): one active compiled module."""
        # lazy: vllm loads after platform.configure() sets its env
        from vllm.v1.worker.gpu import cudagraph_utils

        wrapper = cudagraph_utils.TorchCompileWithNoGuardsWrapper
        compiled = wrapper.__new__(wrapper)
        compiled.__dict__["do_not_compile"] = False
        return [self, compiled]

    def __call__(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> Any:
        self.last_inputs = {"input_ids": input_ids, "positions": positions}
        num_tokens = positions.shape[-1] if positions is not None else input_ids.shape[0]
        return self.names.hidden_states(num_tokens)

    def compute_logits(self, hidden_states: Any) -> Any:
        """Logits that name the trace's tokens, for any rows (``vllm_sampling.token_names``)."""
        return self.names.logits(hidden_states, self.target_tokens, self.vocab_size, self.spread_rows)


class FullGraphReplay:
    """CudaGraphManager.run_fullgraph without CUDA: a FULL graph replays the
    model on the runner's input buffers at the descriptor's token count."""

    def __init__(self, torch: Any, device: Any) -> None:
        self._torch = torch
        self._device = device
        self.replayed: list[Any] = []

    def __call__(self, desc: Any) -> Any:
        self.replayed.append(desc)
        return self._torch.zeros(desc.num_tokens, HIDDEN_SIZE, device=self._device)


class ModelStateStandIn:
    """The model-specific state: plain text models keep nothing here that the
    input path reads. ``prepare_attn`` stands in for the attention metadata
    builders and records the batch, block tables and slot mappings it gets."""

    num_new_sampled_tokens_per_step = 1
    supports_mm_inputs = False

    def __init__(self, max_model_len: int = 0, runner: Any = None) -> None:
        self.max_model_len = max_model_len  # DCP capture context reads it
        self.runner = runner  # its model names each forward's tokens
        # called with (input_batch, cg_mode, block_tables, slot_mappings, ...)
        self.observer: Any = None
        # called with (input_batch,) from prepare_inputs: every forward's batch,
        # the profile run's too (it skips prepare_attn)
        self.inputs_observer: Any = None

    def add_request(self, req_index: int, new_req_data: Any) -> None:
        pass

    def remove_request(self, req_id: str) -> None:
        pass

    def apply_staged_writes(self) -> None:
        pass

    def postprocess_state(self, *args: Any, **kwargs: Any) -> None:
        pass

    def preprocess_state(self, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_attn(self, input_batch: Any, cg_mode: Any, block_tables: Any, slot_mappings: Any,
                     *args: Any, **kwargs: Any) -> dict[str, Any]:
        if self.observer is not None:
            self.observer(input_batch, cg_mode, block_tables, slot_mappings, *args, **kwargs)
        return {}

    def prepare_inputs(self, input_batch: Any, req_states: Any) -> dict[str, Any]:
        getattr(getattr(self.runner, "model", None), "names", _NO_NAMES).on_inputs(input_batch, req_states)
        if self.inputs_observer is not None:
            self.inputs_observer(input_batch)
        return {}

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, Any]:
        return {}

    def capture_inner_cudagraphs(self, *args: Any, **kwargs: Any) -> None:
        pass


class LoraManagerStandIn:
    """The worker's LoRA model manager (``runner.lora_manager``): the real one
    loads adapter weights into the model's LoRA layers. The runner's own
    ``_set_active_loras`` / ``maybe_dummy_run_with_lora`` / capture hook call it;
    it keeps the last calls' arguments (not all: each holds max_loras ids) and loads nothing."""

    def __init__(self) -> None:
        # the last set_active_adapters calls: (sorted adapter ids, LoRAMapping)
        self.activations: deque[tuple[list[int], Any]] = deque(maxlen=16)
        self._dummies: set[int] = set()

    def set_active_adapters(self, requests: set[Any], mapping: Any | None) -> None:
        self.activations.append((sorted(r.lora_int_id for r in requests), mapping))

    def get_dummy_lora_warmup_rank(self, default_rank: int) -> int:
        return default_rank

    @contextmanager
    def dummy_lora_cache(self) -> Iterator[None]:
        yield

    def add_dummy_lora(self, lora_request: Any, rank: int) -> bool:
        if lora_request.lora_int_id in self._dummies:
            return False
        self._dummies.add(lora_request.lora_int_id)
        return True

    def list_adapters(self) -> set[int]:
        return set(self._dummies)

    def remove_all_adapters(self) -> None:
        self._dummies.clear()
