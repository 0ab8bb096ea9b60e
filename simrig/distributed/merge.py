"""Merging what workers return into what one process would have kept.

    ClassTally per unit / shard ──merge_tallies (simrig.findings.classes)──► one ClassTally;
                                  a shard's places renamed with ``prefixed``, a lost
                                  shard's classes from its heartbeat (``tally_from_counts``)
    frames per shard ──concat_frames / merge_contract──► one steps / occurrences / contract table

Used by the sharded replay (units in one-process order) and the sharded fuzz
campaign (shards in plan order, their example names prefixed with the shard).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pandas as pd

from simrig.findings.classes import ClassTally, Where
from simrig.replay import sort_rows


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
    frames = [f for f in frames if f is not None and len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def merge_contract(frames: list[Any]) -> Any:
    """Sum counts per (stage, field, kind, dtype); the first occurrence from the first frame."""
    frame = concat_frames(frames)
    if not len(frame):
        return frame
    keys = ["stage", "field", "kind", "dtype"]
    counts = frame.groupby(keys, sort=False)["count"].sum()
    first = frame.drop_duplicates(keys).set_index(keys)
    first["count"] = counts
    return sort_rows(first.reset_index(), keys)
