"""Trace files: format v1 (JSON Lines), its reader and its writer.

``trace_format.py`` (the data model and one line's parsing), ``trace.py``
(the streaming reader, identity checks, ``trace_files_in``), ``bounds.py``
(every size against the trace's config, the config against the machine) and
``trace_writer.py``. The full specification is traces/README.md. It may
import the core (the step model, ``host_memory``) and ``sampling`` (a request's ``sampling``
object) only: never ``vllm`` or the adapters' rooms, the
oracle, ``sources``, ``report``, ``campaign`` or ``selftest``.
"""
