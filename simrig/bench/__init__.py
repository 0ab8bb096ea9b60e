"""``simrig bench``: running the pytest-benchmark suites and comparing saved runs.

    suites.py  runs the suites (tests/bench), loads saved runs, names sides of a
               comparison, interleaves two interpreters in rounds
    saves.py   sets of saved runs compared: B/A per benchmark, verdicts from the
               spread between saves
    stats.py   bootstrap confidence intervals for interleaved timing rounds
               (also used by ``simrig compare``)
    render.py  a comparison's markdown, CSV and HTML

May import ``simrig.errors`` and the standard scientific stack only: the suites
run in their own pytest process, so nothing here imports vllm, the adapters,
checks, report, campaign, selftest or the command line (``cli``).
"""
