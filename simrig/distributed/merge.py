"""Merging what workers return into what one process would have kept.

    ClassTally per unit / shard ──merge_tallies──► one ClassTally: occurrences summed,
                                                   first from the earliest part, last from
                                                   the latest, request ids and checks joined
    frames per shard ──concat_frames / merge_contract──► one steps / occurrences / contract table

Used by the sharded replay (units in one-process order) and the sharded fuzz
campaign (shards in plan order, their example names prefixed with the shard).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from simrig.report.classes import MAX_REQ_IDS, ClassStats, ClassTally, Where


def merge_tallies(parts: Iterable[tuple[ClassTally, Callable[[Where], Where] | None]]) -> ClassTally:
    """One tally from several, in the order given; each part's places may be
    renamed (``rename(where) -> where``, e.g. a shard prefix)."""
    merged = ClassTally()
    for tally, rename in parts:
        def moved(where: Where) -> Where:
            return rename(where) if rename is not None else where

        for key, part in tally.classes.items():
            into = merged.classes.get(key)
            if into is None:
                into = merged.classes[key] = ClassStats(
                    part.kind, part.stage, part.field, part.exception_type, part.verdict,
                    message=part.message, explanation=part.explanation, evidence=part.evidence)
            into.occurrences += part.occurrences
            into.checks |= part.checks
            for where in part.traces.values():
                where = moved(where)
                into.traces.setdefault(where.trace, where)
            if part.first is not None and into.first is None:
                into.first = (moved(part.first[0]), *part.first[1:])
            if part.last is not None:
                into.last = (moved(part.last[0]), *part.last[1:])
            for req_id in part.req_ids:
                if len(into.req_ids) < MAX_REQ_IDS and req_id not in into.req_ids:
                    into.req_ids.append(req_id)
            if not into.explanation and part.explanation:
                into.explanation, into.evidence = part.explanation, part.evidence
    return merged


def tally_from_counts(shard: str, state: Any, classes: dict[Any, Any]) -> ClassTally:
    """A lost shard's classes from its last heartbeat (``state.counts``): the
    occurrences it counted, its first finding per class, no places."""
    tally = ClassTally()
    for key, count in (state.counts if state is not None else {}).items():
        if count and key in classes:
            tally.add(classes[key].first, Where(f"{shard}/lost"), count=count)
    return tally


def prefixed(prefix: str) -> Callable[[Where], Where]:
    """rename for merge_tallies: 'example-3' -> 's1/example-3'."""
    return lambda where: dataclasses.replace(where, trace=f"{prefix}/{where.trace}")


def concat_frames(frames: list[Any]) -> Any:
    import pandas as pd

    frames = [f for f in frames if f is not None and len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def merge_contract(frames: list[Any]) -> Any:
    """Sum counts per (stage, field, kind, dtype); the first occurrence from the first frame."""
    from simrig.replay import sort_rows

    frame = concat_frames(frames)
    if not len(frame):
        return frame
    keys = ["stage", "field", "kind", "dtype"]
    counts = frame.groupby(keys, sort=False)["count"].sum()
    first = frame.drop_duplicates(keys).set_index(keys)
    first["count"] = counts
    return sort_rows(first.reset_index(), keys)
