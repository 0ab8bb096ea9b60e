"""Per-test CPU seconds, for finding what makes a tier slow (``SIMRIG_TEST_CPU=path``).

Wall time (``--durations``) hides where the two cores go: a test that waits on a child
importing vLLM and a test that computes look alike. Each test's line records the CPU
seconds of the test process and of the children it waited for (``RUSAGE_CHILDREN``:
subprocess CLI runs, forked workers), appended as ``nodeid<TAB>self<TAB>children<TAB>wall``.
Ray workers are not children of the test process and are not counted.
"""

from __future__ import annotations

import os
import resource
import time

import pytest


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("SIMRIG_TEST_CPU")
    if not path:
        yield
        return
    before = (_cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic())
    yield
    own = _cpu(resource.RUSAGE_SELF) - before[0]
    children = _cpu(resource.RUSAGE_CHILDREN) - before[1]
    wall = time.monotonic() - before[2]
    with open(path, "a") as ledger:
        ledger.write(f"{item.nodeid}\t{own:.2f}\t{children:.2f}\t{wall:.2f}\n")
