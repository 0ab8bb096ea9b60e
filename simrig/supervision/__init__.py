"""Work that may kill its process, run in forked workers under a supervisor.

``forked.py`` (the fork, relay and wait loop; the state workers share),
``campaign_worker.py`` (``simrig fuzz``'s campaign: resumed from checkpoints, a
crash or hang recorded as a ``crash`` class), ``crash_shrink.py`` (a crash class's
example shrunk by replays in forked children), ``replay_workers.py`` (``simrig
replay``: units of trace x PCP size, the crashed one recorded and skipped),
``zygote.py`` (processes forked from one that has loaded vLLM: the selftest's runs).
It may import the core, ``trace_io``, ``findings``, ``checks`` (the scheduler
contract), ``report``, ``replay`` and ``campaign``; never ``selftest``, ``cli`` or
``distributed``.
"""
