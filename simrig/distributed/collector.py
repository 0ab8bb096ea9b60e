"""The driver's actors: where shards report, and the example database they share.

    shard ──report_class(FindingClass)──► Collector ◄──snapshot()── driver
          ──beat(stats, counts)─────────►   keeps per class the shortest failing run,
          ◄──(stop?, classes shrunk)──────  who found it, per-shard counts and stats

    shard (Hypothesis) ──save/fetch/delete──► SharedDatabase (on the driver's node)
                                              = DirectoryBasedExampleDatabase(--database)

A class is reported the moment a shard first sees it and again each time the
shard finds a smaller failing run, so a worker that dies loses nothing it
already reported. Both classes are plain Python; ``cluster`` turns them into
Ray actors (num_cpus=0: they never take a worker's CPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from simrig.campaign.fuzz import FindingClass, Key


@dataclass
class ShardState:
    """What the driver knows about one shard, from its heartbeats."""

    name: str
    worker: str = ""
    started_at: float | None = None  # wall clock when its budget started (vLLM loaded)
    last_beat: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)  # CampaignStats fields
    counts: dict[Key, int] = field(default_factory=dict)  # class -> occurrences seen
    finished: bool = False


class Collector:
    """Finding classes and shard states of one sharded campaign."""

    def __init__(self) -> None:
        self.classes: dict[Key, FindingClass] = {}
        self.best_from: dict[Key, str] = {}  # the shard whose run is kept
        self.found_by: dict[Key, list[str]] = {}
        self.shards: dict[str, ShardState] = {}
        self.events: list[str] = []  # one line per new class / shard start, for progress
        self.stop = False

    def _shard(self, name: str) -> ShardState:
        return self.shards.setdefault(name, ShardState(name))

    def report_class(self, shard: str, cls: FindingClass) -> None:
        key = cls.key
        by = self.found_by.setdefault(key, [])
        if shard not in by:
            by.append(shard)
            self.events.append(f"shard {shard} found {':'.join(map(str, key[:4]))}"
                               + (" (loud rejection)" if key[4] else "")
                               + (" (known)" if cls.first.known else ""))
        kept = self.classes.get(key)
        if kept is None or _better(cls, kept, shard == self.best_from.get(key)):
            self.classes[key] = cls
            self.best_from[key] = shard
        state = self._shard(shard)
        state.counts.setdefault(key, 0)

    def beat(self, shard: str, worker: str, started_at: float | None, stats: dict[str, Any],
             counts: dict[Key, int], finished: bool = False) -> tuple[bool, list[Key]]:
        """A shard's heartbeat; returns (stop now?, classes some shard already shrank)."""
        state = self._shard(shard)
        if not state.worker:
            self.events.append(f"shard {shard} started on {worker}")
        state.worker, state.stats, state.last_beat = worker, stats, time.time()
        state.started_at = state.started_at or started_at
        state.counts.update(counts)
        state.finished = finished
        shrunk = [k for k, c in self.classes.items() if c.steps is not None or c.trace_path]
        return self.stop, shrunk

    def request_stop(self) -> None:
        self.stop = True

    def events_since(self, index: int) -> list[str]:
        return self.events[index:]

    def snapshot(self) -> dict[str, Any]:
        return {"classes": self.classes, "best_from": self.best_from, "found_by": self.found_by,
                "shards": self.shards, "stopped": self.stop}


def _better(new: FindingClass, kept: FindingClass, same_shard: bool) -> bool:
    """The shortest failing run wins; a regression trace (already minimal) is kept;
    the same shard may refine its own run's confirmation."""
    if kept.trace_path and kept.steps is None:
        return False
    if new.steps is None:
        return kept.steps is None and new.trace_path != "" and not kept.trace_path
    if kept.steps is None:
        return True
    if new.size() != kept.size():
        return new.size() < kept.size()
    return same_shard and new.reproduced is not None


class SharedDatabase:
    """One Hypothesis example database for every shard, kept in the driver's
    folder (``--database``) so the next campaign starts from what all learned.
    Counts per shard what it saved and fetched (the report shows both)."""

    def __init__(self, path: str) -> None:
        # lazy: hypothesis loads only when this runs
        from hypothesis.database import DirectoryBasedExampleDatabase

        self.db = DirectoryBasedExampleDatabase(path)
        self.saved: dict[str, int] = {}
        self.fetched: dict[str, int] = {}

    def save(self, shard: str, key: bytes, value: bytes) -> None:
        self.db.save(key, value)
        self.saved[shard] = self.saved.get(shard, 0) + 1

    def fetch(self, shard: str, key: bytes) -> list[bytes]:
        values = list(self.db.fetch(key))
        self.fetched[shard] = self.fetched.get(shard, 0) + len(values)
        return values

    def delete(self, shard: str, key: bytes, value: bytes) -> None:
        self.db.delete(key, value)

    def move(self, shard: str, src: bytes, dest: bytes, value: bytes) -> None:
        self.db.move(src, dest, value)

    def stats(self) -> dict[str, dict[str, int]]:
        return {"saved_by_shard": dict(sorted(self.saved.items())),
                "fetched_by_shard": dict(sorted(self.fetched.items()))}


def actor_database(actor: Any, shard: str) -> Any:
    """A Hypothesis ``ExampleDatabase`` that forwards to a SharedDatabase actor."""
    # optional: ray; lazy: hypothesis
    import ray
    from hypothesis.database import ExampleDatabase

    class ActorDatabase(ExampleDatabase):
        def save(self, key: bytes, value: bytes) -> None:
            ray.get(actor.save.remote(shard, key, value))

        def fetch(self, key: bytes):  # type: ignore[override]
            yield from ray.get(actor.fetch.remote(shard, key))

        def delete(self, key: bytes, value: bytes) -> None:
            ray.get(actor.delete.remote(shard, key, value))

        def move(self, src: bytes, dest: bytes, value: bytes) -> None:
            ray.get(actor.move.remote(shard, src, dest, value))

    return ActorDatabase()
