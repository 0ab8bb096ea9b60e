"""Replay sample traces and print what every Triton kernel launch left in its
arguments, as JSON on stdout: run once with ``SIMRIG_INTERPRETER_SPEEDUPS=0``
(Triton's own interpreter plumbing) and once without, the two must agree.
Used by tests/test_interpreter_speed.py in a subprocess of its own (the
interpreter patches are process-wide and cannot be taken back).

    python tests/interp_probe.py TRACE [TRACE ...]
"""

from __future__ import annotations

import hashlib
import json
import sys


def _digest(value: object) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        if value.dtype == torch.uint64:  # tables of data pointers (the block tables'): addresses differ per process
            return [str(value.dtype), list(value.shape)]
        data = value.detach().cpu().contiguous()
        raw = data.view(torch.uint8) if data.numel() else data
        return [str(value.dtype), list(value.shape), hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]]
    if isinstance(value, (int, float, bool, str, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_digest(v) for v in value]
    return type(value).__name__


def _zeroed_allocations() -> None:
    """Every fresh tensor zero-filled: the lanes a kernel leaves unwritten in an output or a
    scratch buffer (``new_empty``: the top-k/top-p kernel's BUFFER, the rejection sampler's
    statistics on bonus rows, the sampled tokens past a request's count) otherwise hold
    whatever the allocator handed out, which differs between the two processes."""
    import torch

    def zeroed(allocate):
        return lambda *args, **kwargs: allocate(*args, **kwargs).zero_()

    torch.empty, torch.empty_like = zeroed(torch.empty), zeroed(torch.empty_like)
    torch.Tensor.new_empty = zeroed(torch.Tensor.new_empty)


def main(paths: list[str]) -> None:
    from simrig.vllm_runtime import platform

    platform.configure(force_cpu=True)
    _zeroed_allocations()
    from simrig.adapters.runner import load

    load()
    from triton.runtime import interpreter

    from simrig.replay import replay_traces

    launches: list[list] = []
    executor = interpreter.GridExecutor
    inner = executor.__call__

    def record(self, *args, **kwargs):
        result = inner(self, *args, **kwargs)
        launches.append([self.fn.__name__, _digest(list(args)), sorted((k, _digest(v)) for k, v in kwargs.items())])
        return result

    executor.__call__ = record
    result = replay_traces(paths)
    steps = result.steps.drop(columns=["duration_ms"], errors="ignore")
    findings = result.findings
    if "req_ids" in findings:  # make_dummy names requests with random uuids (vLLM's choice)
        ids = findings["req_ids"].astype(str)
        findings = findings.assign(req_ids=ids.where(~ids.str.contains(r"(?:^|,)req_\d+_[0-9a-f]{16}"), "<dummy>"))
    if "message" in findings:
        findings = findings.assign(message=findings["message"].astype(str).str.replace(
            r"req_\d+_[0-9a-f]{16}", "<dummy>", regex=True))
    from simrig.triton_interpreter import interpreter_speed

    print(json.dumps({
        "speedups": {
            "memoise_np_dtype": getattr(interpreter._get_np_dtype, "__simrig_memo__", False),
            "lean_builtin_calls": getattr(interpreter._patch_attr, "__simrig_lean__", False),
            "cache_launch_binding": isinstance(interpreter.inspect, interpreter_speed._Inspect),
            "args_in_place": getattr(executor._init_args_hst, "__simrig_in_place__", False),
            "fast_splat": getattr(interpreter.interpreter_semantic.broadcast_impl_value, "__simrig_fast__", False),
        },
        "launches": launches,
        "steps": steps.to_csv(index=False),
        "findings": findings.to_csv(index=False),
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
