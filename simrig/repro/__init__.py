"""``simrig repro``: a finding class as one standalone pytest file for vLLM's own tests.

``pytest_file.py`` writes (and may run) the file from ``template.py``, ``cpu_runner.py`` and
``drive.py``, or for a sampling class from ``simrig.repro_sampling`` (text: the file imports only
vLLM, torch, numpy, pytest and the standard library); ``upstream.py`` and ``impact.py`` make a folder ready for
vLLM. The templates' vLLM imports are never executed here.

See docs/bisect.md, 'From finding to fix'; what this package may import is in docs/layout.md.
"""
