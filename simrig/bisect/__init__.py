"""``simrig bisect``: the release or commit where a finding class appeared or went away.

    search.py   the search itself over ordered points (good / bad / skip), and
                ClassKey, a finding class as ``kind:stage:field[:exception_type]``
    points.py   one point: a release's side venv or a commit laid over a release,
                judged by replaying a trace in a child process
    gitrepo.py  the user's vLLM checkout, read only: commits, a commit's MRV2 files
    run.py      the bisect driven end to end and its report

May import the core, findings, report, history (the row a bisect appends) and
``simrig.releases.envs`` (the side venvs a point runs in). Each point's vLLM runs in
a child process (``python -m simrig.vllm_runtime.overlay``), so nothing here imports
vllm or the adapters; never ``campaign``, ``selftest``, ``cli`` or ``repro``.
"""
