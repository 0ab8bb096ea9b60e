"""``runner.sampler``: vLLM's own ``Sampler`` holding every request's sampling state,
sampling each batch (``SIMRIG_SAMPLER``, simrig.sampling.logits), observed by wrapping.

    add_request ────────────► Sampler.add_request (every request: the slot tables are vLLM's)
    apply_staged_writes ────► Sampler.apply_staged_writes
    __call__(logits, batch) ─► Sampler          as the harness says (default: every batch)
                            └► the stand-in     otherwise (one-hot rows: the same tokens)
    Sampler.sample ──wrapped──► SampledRows: processed logits and sampled token per row

On one-hot rows any sampler picks the row's token (tests/test_sampling.py), so the stand-in
may take batches without parameters (SIMRIG_SAMPLER=parameters). vLLM draws an unseeded
request's seed from numpy's global generator: under a seed fixed by slot and admission
count, so a replay samples the same tokens every time.
"""

from __future__ import annotations

import contextlib
import inspect
import zlib
from typing import Any, Iterator, NamedTuple

import numpy as np

from simrig.triton_libdevice.libdevice import called_in
from simrig.vllm_runtime import platform


class SampledRows(NamedTuple):
    """What one ``Sampler.sample`` call computed, copied out. # [num_rows, ...]"""

    processed: np.ndarray  # [num_rows, vocab_size] float32: the row sampled from
    sampled: np.ndarray  # [num_rows] int64
    slots: np.ndarray  # [num_rows] the request-state slot each row read (expanded_idx_mapping)


def build_sampler(runner: Any) -> Any:
    """vLLM's ``Sampler`` with the arguments the runner's ``load_model`` gives it (those
    the release's signature takes)."""
    # lazy: vllm loads after platform.configure() sets its env
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    wanted = {"vllm_config": runner.vllm_config, "max_num_reqs": runner.max_num_reqs,
              "vocab_size": runner.vocab_size, "device": runner.device, "req_states": runner.req_states,
              "num_speculative_tokens": runner.decode_query_len}
    params = inspect.signature(Sampler).parameters
    return Sampler(**{k: v for k, v in wanted.items() if k in params})


def sampler_runs_here() -> bool:
    """Whether the release's Gumbel kernel runs here: on a GPU always; in Triton's CPU
    interpreter where it answers every libdevice function the kernel calls (0.30.0's
    ``tldevice.log1p``: the ``answer_libdevice`` patch)."""
    from vllm.v1.worker.gpu.sample import gumbel  # lazy: vllm loads after platform.configure()

    return platform.libdevice_runs(called_in(inspect.getsource(gumbel)))


class SamplerSwitch:
    """vLLM's ``Sampler`` for state and the batches the harness hands it; ``stand_in`` else."""

    def __init__(self, real: Any, stand_in: Any) -> None:
        self.real = real
        self.stand_in = stand_in
        self.use_real = False  # set by the harness before each sample_tokens
        self.rows: list[SampledRows] = []
        self.num_added = 0  # add_request calls so far: with the slot, what fixes a drawn seed
        self._sample = real.sample
        real.sample = self._observed_sample

    def __getattr__(self, name: str) -> Any:
        # sampling_states, penalties_state, compute_nans, logprobs_mode ...: the real one's
        if name == "real":
            raise AttributeError(name)
        return getattr(self.real, name)

    def add_request(self, *args: Any) -> None:
        self.num_added += 1
        with _seeded(f"{int(args[0])}:{self.num_added}"):
            self.real.add_request(*args)

    def apply_staged_writes(self) -> None:
        self.real.apply_staged_writes()

    def __call__(self, logits: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if self.use_real:
            return self.real(logits, input_batch, *args, **kwargs)
        return self.stand_in(logits, input_batch)

    def take_rows(self) -> list[SampledRows]:
        rows, self.rows = self.rows, []
        return rows

    def _observed_sample(self, logits: Any, expanded_idx_mapping: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._sample(logits, expanded_idx_mapping, *args, **kwargs)
        if isinstance(out, tuple) and len(out) == 2 and getattr(out[1], "ndim", 0) == 2:
            sampled, processed = out
            self.rows.append(SampledRows(
                processed.detach().cpu().float().numpy().copy(),
                sampled.detach().cpu().numpy().astype(np.int64).reshape(-1),
                expanded_idx_mapping.detach().cpu().numpy().astype(np.int64).copy()))
        return out


@contextlib.contextmanager
def _seeded(key: str) -> Iterator[None]:
    """numpy's global generator seeded for one add_request, then put back as it was."""
    state = np.random.get_state()
    np.random.seed(zlib.crc32(key.encode()))
    try:
        yield
    finally:
        np.random.set_state(state)
