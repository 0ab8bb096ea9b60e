"""A memory checker for kernels run in Triton's interpreter (``SIMRIG_MEMCHECK=1``).

On a GPU an out-of-bounds store of an MRV2 kernel corrupts memory silently. With memcheck installed,
every load, store and atomic of a launch checks its unmasked lanes against the allocations of the
kernel's tensor arguments (and of tensors whose ``data_ptr()`` vLLM took) before Triton's own access
runs, and offset arithmetic is checked for overflow: a ``KernelMemoryError`` (or ``KernelOverflowError``)
names the kernel, argument, element and source line (``install``). See docs/replay.md, 'Memcheck'.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import os
import sys
import weakref
from typing import Any

import numpy as np


class KernelMemoryError(RuntimeError):
    """A kernel's load, store or atomic outside every allocation of its launch."""

    def __init__(self, message: str, **facts: Any) -> None:
        super().__init__(message)
        self.facts = facts  # kernel, argument, index, bounds, op, address, where (base, nbytes)


class KernelOverflowError(KernelMemoryError):
    """Integer overflow in a kernel's offset arithmetic (narrower than 64 bits)."""


_COUNTS = {"launches": 0, "accesses": 0, "lanes": 0, "overflow_checks": 0, "unchecked_launches": 0}
_saved: list[tuple[Any, str, Any, bool]] = []  # (owner, name, previous value, was in owner's __dict__)
_launch: _Launch | None = None
_pointed: dict[int, weakref.ref] = {}  # data_ptr() taken outside a launch -> the tensor, weakly
_prune_at = 4096
_HERE = os.path.dirname(os.path.abspath(__file__))
# the interpreter's own plumbing (frames between the kernel's line and the checker)
_INTERPRETER = os.path.join(os.path.dirname(_HERE), "triton_interpreter")


def stats() -> dict[str, int]:
    """What memcheck checked in this process: launches, accesses (loads, stores,
    atomics), lanes, overflow checks, launches left unchecked (non-CPU tensors)."""
    return dict(_COUNTS)


def installed() -> bool:
    """Whether ``install`` is in effect in this process."""
    return bool(_saved)


class _Launch:
    """One launch's allocations: per argument, and merged into disjoint intervals
    for the one bisect per access."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel
        self.args: list[tuple[str, Any, int, int, int]] = []  # name, tensor, data_ptr, base, nbytes
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.resolved: set[int] = set()

    def add(self, name: str, tensor: Any, base: int, nbytes: int) -> None:
        self.args.append((name, tensor, _raw_data_ptr(tensor), base, nbytes))

    def merge(self) -> None:
        starts: list[int] = []
        ends: list[int] = []
        for _, _, _, base, nbytes in sorted(self.args, key=lambda a: a[3]):
            if starts and base < ends[-1]:  # overlapping storages: one interval
                ends[-1] = max(ends[-1], base + nbytes)
            elif nbytes:
                starts.append(base)
                ends.append(base + nbytes)
        self.starts, self.ends = starts, ends

    def holds(self, lo: int, hi: int) -> bool:
        at = bisect.bisect_right(self.starts, lo) - 1
        return at >= 0 and hi <= self.ends[at]


def _raw_data_ptr(tensor: Any) -> int:
    """The tensor's data pointer, past the ``data_ptr`` hook (a launch's own
    arguments are no pointer vLLM took)."""
    import torch  # imported by then: only launches with tensor arguments get here

    return torch._C.TensorBase.data_ptr(tensor)


def _collect(launch: _Launch, name: str, value: Any, torch: Any) -> bool:
    """Record ``value``'s allocations under ``name``; False for a tensor the
    kernel does not see in place (not on the CPU)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            return False
        storage = value.untyped_storage()
        launch.add(name, value, storage.data_ptr(), storage.nbytes())
    elif isinstance(value, (tuple, list)):
        return all(_collect(launch, f"{name}[{i}]", v, torch) for i, v in enumerate(value))
    elif isinstance(getattr(value, "base", None), torch.Tensor):  # a TensorWrapper, a tensor descriptor
        return _collect(launch, f"{name}.base", value.base, torch)
    return True


def _where() -> str:
    """The innermost kernel line on the stack (a frame outside Triton and simrig)."""
    import triton  # lazy: triton loads only when this runs

    skip = (os.path.dirname(os.path.abspath(triton.__file__)), _HERE, _INTERPRETER)
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(skip) and "numpy" not in path:
            short = path.split("site-packages" + os.sep, 1)[-1]
            return f"{short}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _report(launch: _Launch, addrs: np.ndarray, size: int, op: str, element: str, lanes: int) -> None:
    """Raise for the first lane of ``addrs`` outside the launch's allocations."""
    starts = np.array(launch.starts, dtype=np.uint64)
    ends = np.array(launch.ends, dtype=np.uint64)
    flat = addrs.reshape(-1)
    at = np.searchsorted(starts, flat, side="right").astype(np.int64) - 1
    ok = at >= 0
    if len(ends):
        ok &= flat <= ends[np.maximum(at, 0)] - np.uint64(size)
    bad_lanes = np.flatnonzero(~ok)
    addr = int(flat[bad_lanes[0]])
    holders = [a for a in launch.args if ((flat >= a[3]) & (flat < a[3] + a[4]) & ok).any()] if ok.any() else []
    below = [a for a in launch.args if a[3] <= addr]
    above = [a for a in launch.args if a[3] > addr]  # a negative index: the nearest allocation above
    pick = (min(holders, key=lambda a: min(abs(addr - a[3]), abs(addr - a[3] - a[4]))) if holders
            else max(below, key=lambda a: (a[3], a[2] <= addr, a[2])) if below
            else min(above, key=lambda a: (a[3], a[2])) if above else None)
    where = _where()
    count = f"{len(bad_lanes)} of {lanes} unmasked lanes"
    if pick is None:
        raise KernelMemoryError(
            f"{op} out of bounds in {launch.kernel}: address {addr:#x} ({element}, {count}) is in no "
            f"argument's allocation, at {where}",
            kernel=launch.kernel, argument=None, index=None, bounds=None, op=op, address=addr, where=where)
    name, _, ptr, base, nbytes = pick
    index = _signed(addr - ptr) // size
    bounds = ((base - ptr) // size, (base + nbytes - ptr) // size)
    raise KernelMemoryError(
        f"{op} out of bounds in {launch.kernel}: {name}[{index}] outside [{bounds[0]}, {bounds[1]}) "
        f"({element}, {count}; allocation {nbytes} B) at {where}",  # no address: the same text every run
        kernel=launch.kernel, argument=name, index=index, bounds=bounds, op=op, address=addr, where=where,
        base=base, nbytes=nbytes)


def _check(ptrs: Any, mask: Any, op: str) -> None:
    """Check the unmasked lanes of one access; raise before it happens."""
    launch = _launch
    if launch is None:
        return
    addrs = ptrs.data
    if mask is not None:
        keep = mask.data if mask.data.dtype == np.bool_ else mask.data != 0  # 0/1 lanes: by truth, not index
        if keep.shape != addrs.shape:
            keep = np.broadcast_to(keep, addrs.shape)
        if not keep.all():
            addrs = addrs[keep]
    _COUNTS["accesses"] += 1
    n = addrs.size
    if n == 0:
        return
    _COUNTS["lanes"] += n
    element = ptrs.dtype.element_ty
    size = max(1, element.primitive_bitwidth // 8)
    lo, hi = (int(addrs.item()),) * 2 if n == 1 else (int(addrs.min()), int(addrs.max()))
    if not launch.holds(lo, hi + size):  # one bisect: every lane inside one allocation
        _report(launch, addrs, size, op, str(element), n)


def _resolve(launch: _Launch, addr: int) -> None:
    """A pointer the kernel cast from an integer: add the allocation of the
    tensor it points into, when vLLM took that tensor's ``data_ptr()``."""
    launch.resolved.add(addr)
    if addr <= 0 or launch.holds(addr, addr + 1):  # null (an absent optional tensor), or an argument
        return
    ref = _pointed.get(addr)
    candidates = [ref] if ref is not None and ref() is not None else list(_pointed.values())
    for ref in candidates:
        tensor = ref()
        if tensor is None:
            continue
        storage = tensor.untyped_storage()
        base, nbytes = storage.data_ptr(), storage.nbytes()
        if base <= addr < base + nbytes:
            launch.add(_table_name(launch, addr), tensor, base, nbytes)
            launch.merge()
            return


def _table_name(launch: _Launch, addr: int) -> str:
    """``*table[i]`` for the argument (a small 64-bit integer tensor) holding ``addr``."""
    import torch  # lazy: torch loads only when this runs

    for name, tensor, *_ in launch.args:
        if tensor.dtype in (torch.int64, torch.uint64) and tensor.numel() <= 4096:
            values = tensor.detach().reshape(-1).view(torch.int64).numpy()
            found = np.flatnonzero(values == _signed(addr))
            if len(found):
                return f"*{name}[{int(found[0])}]"
    return f"*{addr:#x}"


def _note_pointer(tensor: Any, addr: int) -> None:
    global _prune_at
    if _launch is None and addr:  # inside a launch it is Triton passing an argument
        _pointed[addr] = weakref.ref(tensor if tensor._base is None else tensor._base)  # a view may die first
        if len(_pointed) > _prune_at:
            for key in [k for k, r in _pointed.items() if r() is None]:
                del _pointed[key]
            _prune_at = max(4096, 2 * len(_pointed))


_OPS = {"add": (operator.add, "+"), "sub": (operator.sub, "-"), "mul": (operator.mul, "*")}


def _overflow_check(builder: Any) -> Any:
    """Triton's ``binary_op_sanitize_overflow_impl(lhs, rhs, binary_op)``, answered in numpy."""

    def check(lhs: Any, rhs: Any, binary_op: Any) -> None:
        launch = _launch
        ty = lhs.type.scalar
        if launch is None or ty.int_bitwidth >= 64 or not builder.options.sanitize_overflow \
                or ty.is_int_unsigned():  # unsigned arithmetic wraps by definition (hashes, RNG)
            return
        _COUNTS["overflow_checks"] += 1
        fn, symbol = _OPS.get(getattr(binary_op, "__name__", ""), (None, "?"))
        if fn is None:
            return
        a, b = lhs.handle.data, rhs.handle.data
        lo, hi = ty.get_int_min_value(), ty.get_int_max_value()
        if a.size == 1 and b.size == 1:
            if lo <= fn(int(a.item()), int(b.item())) <= hi:
                return
        wide = np.uint64 if ty.is_int_unsigned() and symbol != "-" else np.int64  # exact for every pair
        result = fn(a.astype(wide), b.astype(wide))
        bad = (result > hi) if wide is np.uint64 else (result < lo) | (result > hi)
        if not bad.any():
            return
        first = np.flatnonzero(bad.reshape(-1))
        at = int(first[0])
        x, y, r = (int(np.broadcast_to(v, bad.shape).reshape(-1)[at]) for v in (a, b, result))
        where = _where()
        raise KernelOverflowError(
            f"{ty} overflow in {launch.kernel}: {x} {symbol} {y} = {r} outside [{lo}, {hi}] "
            f"({len(first)} of {bad.size} lanes) at {where}",
            kernel=launch.kernel, argument=None, index=at, bounds=(lo, hi), op=symbol, address=None,
            where=where)

    return check


def _set(owner: Any, name: str, value: Any) -> None:
    _saved.append((owner, name, getattr(owner, name), name in vars(owner)))
    setattr(owner, name, value)


def install() -> bool:
    """Check every load, store and atomic of every interpreted kernel launch, and its narrow integer
    arithmetic for overflow. Returns whether it was installed (False: already installed, or a Triton
    without this interpreter layout).

    On a GPU an out-of-bounds store of an MRV2 kernel corrupts memory silently; in the interpreter
    it writes the CPU heap. With memcheck installed, each kernel launch knows the allocations
    (storage base, bytes) of its tensor arguments by parameter name, and every load, store and
    atomic checks its unmasked lanes (address .. address + element size) against them before
    Triton's own access runs, so the heap is never touched. A lane outside every allocation raises
    ``KernelMemoryError`` naming the kernel, the argument (the one holding the access's other lanes,
    else the one whose base is the largest below the address, else the nearest above), the element
    index, the bounds, the operation and the kernel's source line.

    Pointers a kernel casts from integers (vLLM's block-table pointer tables) point at tensors that
    are no argument: their allocations are resolved from the tensors whose ``data_ptr()`` vLLM took
    outside a launch, held weakly.

    Offset arithmetic: Triton's overflow sanitizer (which ops it covers, where a kernel opts out) is
    turned back on, and its check, whose answer is dropped without ``options.debug``, is answered
    with one numpy comparison that raises ``KernelOverflowError`` (a ``KernelMemoryError``). Other
    ``device_assert``s stay off, as on a GPU without debug.

    An exception inside a kernel reaches vLLM as Triton's ``InterpreterError``; the launch hands
    back the checker's own exception instead, so a finding carries its type and text. ``install`` /
    ``uninstall``; ``stats`` counts what was checked. A launch with a non-CPU tensor (a host copy,
    elsewhere) is left unchecked and counted.
    """
    if _saved:
        return False
    try:
        import torch  # optional: torch, triton
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    semantic = getattr(interpreter, "interpreter_semantic", None)
    executor = getattr(interpreter, "GridExecutor", None)
    needed = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas",
              "create_int_to_ptr", "options")
    if (builder is None or executor is None or not all(hasattr(builder, n) for n in needed)
            or not hasattr(semantic, "binary_op_sanitize_overflow_impl")
            or not dataclasses.is_dataclass(builder.options)):
        return False
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas, to_ptr = builder.create_atomic_rmw, builder.create_atomic_cas, builder.create_int_to_ptr
    launch_original = executor.__call__
    raw_data_ptr = torch._C.TensorBase.data_ptr

    # Builder methods as instance attributes: Triton's create_load / create_store,
    # block-pointer and descriptor accesses all reach these through ``self.``.
    def create_masked_load(ptrs: Any, mask: Any, *rest: Any, **kw: Any) -> Any:
        _check(ptrs, mask, "load")
        return load(ptrs, mask, *rest, **kw)

    def create_masked_store(ptrs: Any, value: Any, mask: Any, *rest: Any, **kw: Any) -> Any:
        _check(ptrs, mask, "store")
        return store(ptrs, value, mask, *rest, **kw)

    def create_atomic_rmw(op: Any, ptr: Any, val: Any, mask: Any, *rest: Any) -> Any:
        _check(ptr, mask, "atomic")
        return rmw(op, ptr, val, mask, *rest)

    def create_atomic_cas(ptr: Any, *rest: Any) -> Any:
        _check(ptr, None, "atomic")
        return cas(ptr, *rest)

    def create_int_to_ptr(src: Any, dst_type: Any) -> Any:
        out = to_ptr(src, dst_type)
        launch = _launch
        if launch is not None:
            values = out.data
            for addr in ((int(values.item()),) if values.size == 1 else set(values.reshape(-1).tolist())):
                if addr not in launch.resolved:
                    _resolve(launch, addr)
        return out

    def launch_kernel(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _launch
        outer = _launch
        launch = _Launch(getattr(self.fn, "__name__", "kernel"))
        names = self.arg_names
        in_place = all(_collect(launch, names[i] if i < len(names) else f"#{i}", value, torch)
                       for i, value in enumerate(args))
        in_place = in_place and all(_collect(launch, name, value, torch) for name, value in kwargs.items())
        launch.merge()
        _COUNTS["launches" if in_place else "unchecked_launches"] += 1
        _launch = launch if in_place else None
        try:
            return launch_original(self, *args, **kwargs)
        except Exception as exc:
            cause: BaseException | None = exc
            while cause is not None and not isinstance(cause, KernelMemoryError):
                cause = cause.__cause__
            if cause is not None and cause is not exc:  # Triton's InterpreterError around it
                raise cause from None
            raise
        finally:
            _launch = outer

    def data_ptr(self: Any) -> int:
        addr = raw_data_ptr(self)
        _note_pointer(self, addr)
        return addr

    launch_kernel.__simrig_original__ = launch_original  # type: ignore[attr-defined]
    data_ptr.__simrig_original__ = raw_data_ptr  # type: ignore[attr-defined]
    for name, value in (("create_masked_load", create_masked_load), ("create_masked_store", create_masked_store),
                        ("create_atomic_rmw", create_atomic_rmw), ("create_atomic_cas", create_atomic_cas),
                        ("create_int_to_ptr", create_int_to_ptr)):
        _set(builder, name, value)
    _set(semantic, "binary_op_sanitize_overflow_impl", _overflow_check(builder))
    # interpreter.skip_dead_overflow_checks turned the sanitizer off for speed
    _set(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=True))
    _set(executor, "__call__", launch_kernel)
    _set(torch.Tensor, "data_ptr", data_ptr)
    return True


def uninstall() -> bool:
    """Put back what ``install`` replaced. Returns whether anything was installed."""
    if not _saved:
        return False
    while _saved:
        owner, name, value, own = _saved.pop()
        # an instance attribute removed lets the class's own member show through again
        setattr(owner, name, value) if own else delattr(owner, name)
    return True  # _pointed stays: a later install still knows the pointer tables built before
