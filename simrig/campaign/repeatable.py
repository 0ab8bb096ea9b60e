"""Draws that depend on the seed alone.

Hypothesis mixes into its integer, float and string draws the constants it
finds in the "local" (non-library) modules the process has imported
(``hypothesis.internal.conjecture.providers._get_local_constants``). A
campaign's driver and its Ray workers import different simrig modules, and a
driver run under pytest also holds the test files, so the same seed drew
different examples in different processes (a one-worker sharded campaign no
longer repeated the one-process one). For the length of a campaign's
Hypothesis run the local pool is empty; Hypothesis' own global constants
still take part, the same in every process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def seed_only_draws() -> Iterator[None]:
    """Hypothesis draws with no constants from the process's own modules."""
    try:
        from hypothesis.internal.conjecture import providers  # optional: hypothesis
    except ImportError:  # a Hypothesis without local constants
        yield
        return
    original = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    constants = getattr(providers, "Constants", None)
    if original is None or cache is None or constants is None:
        yield
        return
    cache.cache.clear()  # filled from the local pool by earlier runs in this process
    providers._get_local_constants = constants
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.cache.clear()
