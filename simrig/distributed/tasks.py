"""An ordered map of one picklable function over Ray workers.

The self-test's mutants each already run in their own child process; on Ray
each child is started by a task on some worker (one CPU each), and the results
come back in the order given, so the merged scoreboard equals a one-process
run's apart from timings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from simrig.distributed.cluster import worker_options


def map_in_order(ray: Any, fn: Callable[..., Any], calls: Sequence[dict[str, Any]],
                 on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """fn(**kwargs) for each kwargs in ``calls`` as Ray tasks; results in call order.
    ``on_done(index, result)`` runs as each one finishes (progress lines)."""
    task = ray.remote(num_cpus=1, max_retries=1, **worker_options())(fn)
    refs = [task.remote(**kwargs) for kwargs in calls]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        i = index[ready[0]]
        results[i] = ray.get(ready[0])
        if on_done is not None:
            on_done(i, results[i])
    return results
