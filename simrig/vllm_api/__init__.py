"""The vLLM API simrig drives, and every difference between releases there.

``entry_points.py`` (every vLLM function and class the adapter calls, with its
parameters; ``VllmApiError``, ``VllmUnavailable``) and ``versions.py``
(``ApiShape``: what differs between releases, read off the installed code,
never off the version string). Differences between vLLM releases are handled
here and nowhere else. One of the four rooms that may import ``vllm``; it
imports nothing else of simrig, never the oracle, ``sources``, ``report``,
``campaign`` or ``selftest``.
"""
