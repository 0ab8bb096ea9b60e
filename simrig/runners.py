"""Built runners kept between examples and traces: one per (config, stages).

``RunnerPool.acquire`` hands out an idle harness built for the same trace config (or
builds one); ``release`` puts it back only once its state, restored, is as clean as a
fresh build (``simrig/adapters/reuse.py``), and drops it otherwise. ``shared_pool`` is
the process's pool.

See docs/standins.md, 'The runner pool'.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from simrig import harness as harness_module
from simrig import observe as obs
from simrig.coverage import collect
from simrig.step import RunnerConfig
from simrig.triton_memcheck import memcheck
from simrig.vllm_runtime import mutate

DEFAULT_CAPACITY = 8


class RunnerPool:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity < 0:
            raise ValueError(f"capacity: must be >= 0, got {capacity!r}")
        self.capacity = capacity
        self._idle: OrderedDict[tuple, Any] = OrderedDict()
        self.built = 0
        self.reused = 0
        self.dropped = 0
        self.tainted = 0  # dropped because vLLM raised in them (counted in dropped too)
        self.last_dirty: list[str] = []
        # configs built before: only their later builds keep the state after start-up
        # (taking it costs a copy of every buffer; a campaign's configs rarely repeat)
        self._seen: set[tuple] = set()

    @staticmethod
    def _key(config: RunnerConfig, stages: frozenset[str], api: Any) -> tuple:
        # memcheck learns the tensors behind vLLM's pointer tables (block tables) as vLLM
        # takes their data_ptr(): a runner built before memcheck went in would read them as
        # out of bounds, so it is never handed to a checked run
        return (config, stages, id(api), mutate.generation, memcheck.installed())

    def acquire(self, config: RunnerConfig, stages: Iterable[str] = obs.OPTIONAL_STAGES,
                api: Any = None) -> Any:
        """A harness for ``config`` whose runner is as after start-up."""
        from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

        api = api if api is not None else load()
        stages = frozenset(stages)
        key = self._key(config, stages, api)
        harness = self._idle.pop(key, None)
        if harness is not None:
            self.reused += 1
            return harness
        self.built += 1
        harness = harness_module.Harness(config, stages=stages, api=api)
        if hasattr(harness, "reset"):  # a stand-in harness (tests) is never pooled
            harness.pool_key = key
            harness.keep_startup_state = bool(self.capacity) and key in self._seen
        self._seen.add(key)
        return harness

    def release(self, harness: Any) -> bool:
        """Back to the pool if it resets clean; returns whether it was kept."""
        key = getattr(harness, "pool_key", None)
        reset = getattr(harness, "reset", None)
        if key is None or reset is None or not self.capacity:
            return False
        if not harness.resettable:
            return False  # a first build of its config: nothing kept to reset to
        if getattr(harness, "raised_at", None) is not None:
            # vLLM raised in it: a call may have stopped half-way (and on CPU an interpreted
            # kernel may have written past a buffer), so no reset is trusted to make it clean
            self.dropped += 1
            self.tainted += 1
            self.last_dirty = [f"vLLM raised at step {harness.raised_at}: never reused"]
            return False
        try:
            dirty = reset()
        except Exception as exc:  # noqa: BLE001 -- a runner that cannot reset is not reused
            dirty = [f"reset raised {type(exc).__name__}: {exc}"]
        if dirty:
            self.dropped += 1
            self.last_dirty = dirty
            return False
        self._idle[key] = harness
        self._idle.move_to_end(key)
        while len(self._idle) > self.capacity:
            self._idle.popitem(last=False)
        return True

    def clear(self) -> None:
        """Drop every idle runner (the next acquire of each config builds anew)."""
        self._idle.clear()

    def prefer_reuse(self, config: RunnerConfig, stages: Iterable[str] = obs.OPTIONAL_STAGES,
                     api: Any = None) -> None:
        """Keep the start-up state from the first build of ``config`` on."""
        from simrig.adapters.runner import load  # late-bound: tests monkeypatch runner.load

        self._seen.add(self._key(config, frozenset(stages), api if api is not None else load()))

    def stats(self) -> dict[str, int]:
        return {"built": self.built, "reused": self.reused, "dropped": self.dropped,
                "tainted": self.tainted, "idle": len(self._idle)}


_shared: RunnerPool | None = None


def shared_pool() -> RunnerPool:
    """The process's pool (replays, shrink confirmation, the self-test's children)."""
    global _shared
    if _shared is None:
        _shared = RunnerPool()
        # a measured run reaches start-up code too: it never meets a runner built before it
        collect.ON_START.append(_shared.clear)
    return _shared
