"""A runner's state after start-up, kept and put back: one runner for many examples.

``RunnerState`` takes the whole object graph a runner reaches right after
``profile_run`` and ``capture_model``, puts it back in place between examples and
reports any ``differences()``: a runner that is not exactly what a fresh build would
give is dropped, never reused.

See docs/standins.md, 'One runner for many examples'.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

_LEAVES = (int, float, complex, str, bytes, bool, type(None), enum.Enum, torch.dtype, torch.device,
           np.dtype, np.generic, range, slice)
_SKIP_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
               types.CodeType, types.FrameType)
_OWN_MODULES = ("vllm.", "simrig.", "strategies.")
# read-only to the runner, and large: vLLM's configuration objects
_SKIP_MODULES = ("vllm.config", "vllm.platforms", "vllm.logger", "vllm.transformers_utils")


def _walks_into(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    if module.startswith(_SKIP_MODULES):
        return False
    return module.startswith(_OWN_MODULES) or type(obj) is types.SimpleNamespace


def _attributes(obj: Any) -> dict[str, Any] | None:
    """An object's attributes: its __dict__, plus any __slots__ values."""
    out: dict[str, Any] | None = dict(vars(obj)) if hasattr(obj, "__dict__") else None
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()) or ():
            if slot in ("__dict__", "__weakref__") or not hasattr(obj, slot):
                continue
            out = {} if out is None else out
            out.setdefault(slot, getattr(obj, slot))
    return out


class RunnerState:
    """The state of everything reachable from ``roots``, as it was at ``take``."""

    def __init__(self, roots: Iterable[Any]):
        self._roots = list(roots)
        self._objects: list[tuple[Any, dict[str, Any]]] = []  # (object, attributes)
        self._lists: list[tuple[list, list]] = []
        self._dicts: list[tuple[dict, dict]] = []
        self._sets: list[tuple[set, set]] = []
        self._tensors: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._arrays: list[tuple[np.ndarray, np.ndarray]] = []
        self._take()

    # ------------------------------------------------------------ take
    def _take(self) -> None:
        seen: set[int] = set()
        stack = list(self._roots)
        while stack:
            obj = stack.pop()
            if isinstance(obj, _LEAVES) or isinstance(obj, _SKIP_TYPES) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):
                self._tensors.append((obj, obj.detach().clone()))
            elif isinstance(obj, np.ndarray):
                self._arrays.append((obj, obj.copy()))
            elif isinstance(obj, list):
                self._lists.append((obj, list(obj)))
                stack.extend(obj)
            elif isinstance(obj, dict):
                self._dicts.append((obj, dict(obj)))
                stack.extend(obj.keys())
                stack.extend(obj.values())
            elif isinstance(obj, (set, frozenset)):
                if isinstance(obj, set):
                    self._sets.append((obj, set(obj)))
                stack.extend(obj)
            elif isinstance(obj, tuple):
                stack.extend(obj)
            elif _walks_into(obj):
                attrs = _attributes(obj)
                if attrs is not None:
                    self._objects.append((obj, attrs))
                    stack.extend(attrs.values())

    # ------------------------------------------------------------ restore
    def restore(self) -> None:
        """Put every attribute, container and buffer back as it was taken."""
        for obj, attrs in self._objects:
            live = vars(obj) if hasattr(obj, "__dict__") else None
            if live is not None:
                for name in [n for n in live if n not in attrs]:
                    del live[name]
            for name, value in attrs.items():
                if live is not None and name in live:
                    if live[name] is not value:
                        live[name] = value
                elif getattr(obj, name, _MISSING) is not value:
                    object.__setattr__(obj, name, value)
        for live_list, saved in self._lists:
            live_list[:] = saved
        for live_dict, saved in self._dicts:
            if live_dict.keys() != saved.keys() or any(live_dict[k] is not v for k, v in saved.items()):
                live_dict.clear()
                live_dict.update(saved)
        for live_set, saved in self._sets:
            if live_set != saved:
                live_set.clear()
                live_set.update(saved)
        with torch.inference_mode():
            for tensor, saved in self._tensors:
                if tensor.shape == saved.shape:
                    tensor.copy_(saved)
        for array, saved in self._arrays:
            if array.flags.writeable and array.shape == saved.shape:
                np.copyto(array, saved)

    # ------------------------------------------------------------ check
    def differences(self, limit: int = 10) -> list[str]:
        """What differs from the state taken (empty: as clean as at take)."""
        out: list[str] = []
        for obj, attrs in self._objects:
            now = _attributes(obj) or {}
            if now.keys() != attrs.keys():
                out.append(f"{type(obj).__name__}: attributes {sorted(set(now) ^ set(attrs))}")
            else:
                out += [f"{type(obj).__name__}.{n}" for n, v in attrs.items() if not _same(now[n], v)]
            if len(out) >= limit:
                return out[:limit]
        out += [f"list of {len(s)}" for live, s in self._lists if len(live) != len(s)
                or any(not _same(a, b) for a, b in zip(live, s))]
        out += [f"dict of {len(s)}" for live, s in self._dicts if live.keys() != s.keys()
                or any(not _same(live[k], v) for k, v in s.items())]
        out += [f"set of {len(s)}" for live, s in self._sets if live != s]
        with torch.inference_mode():
            out += [f"tensor {tuple(t.shape)} {t.dtype}" for t, s in self._tensors
                    if t.shape != s.shape or not torch.equal(t, s)]
        out += [f"array {a.shape} {a.dtype}" for a, s in self._arrays
                if a.shape != s.shape or not np.array_equal(a, s, equal_nan=a.dtype.kind == "f")]
        return out[:limit]

    @property
    def size(self) -> dict[str, int]:
        """What is held: objects, containers, buffers and their bytes."""
        return {"objects": len(self._objects), "containers": len(self._lists) + len(self._dicts) + len(self._sets),
                "buffers": len(self._tensors) + len(self._arrays),
                "bytes": sum(s.numel() * s.element_size() for _, s in self._tensors)
                + sum(s.nbytes for _, s in self._arrays)}


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # both NaN
    if isinstance(a, _LEAVES) and isinstance(b, _LEAVES):
        try:
            return bool(a == b) and type(a) is type(b)
        except Exception:  # noqa: BLE001 -- an odd __eq__: not the same
            return False
    return False
