"""The package's floors: the one list the layout test enforces and docs/layout.md shows.

Every top-level module and every room (subpackage) stands on one floor and imports only
from the floors below it. ``tests/test_layout.py`` checks every import against ``FLOORS``;
``simrig.report.docs_tables.floors_table()`` renders them for docs/layout.md, between its
markers, and the test fails when the page differs. Plain data: imports nothing.
"""

from __future__ import annotations

# The floors, lowest first: a module imports only from floors below its own (a
# top-level module or a room is one unit; inside a room the cycle scan of the layout test
# holds). Units on one floor never import each other.
FLOORS: tuple[set[str], ...] = (
    {"sampling"},                                      # a request's sampling parameters: plain data
    {"__init__", "step", "errors", "observe", "progress", "interrupt",  # the step model, plain helpers
     "host_memory",                                    # the memory this machine can give a run
     "trace_gate", "lifeline",                         # what a coverage collector traces; a worker's
                                                       # last words
     "layout"},                                        # these floors
    {"triton_interpreter", "triton_memcheck",          # where the kernels run on a CPU; their checker;
     "triton_libdevice"},                              # the device math the interpreter lacks
    {"vllm_runtime", "vllm_api"},                      # the vLLM that runs; what simrig drives in it
    {"vllm_parts", "vllm_sampling"},                   # vLLM's own parts made from a trace config;
                                                       # its sampler driven with each request's params
    {"adapters", "step_context"},                      # the model-less runner; the step in flight
    {"trace_io", "findings", "ledger", "coverage", "dummy_paths", "stage_probes", "bench"},
    {"sources", "reference", "views"},                 # producers of traces; the reference model; page parts
    {"partition", "harness", "report"},                # PCP layout; stepping one runner; reports
    {"graph_rules", "history", "runners", "sampling_checks"},             # cudagraph rules; the history; the runner pool
    {"checks"},                                        # the Checker: every check behind one object
    {"replay"},                                        # the one replay loop
    {"campaign", "releases"},                          # fuzz campaigns; two vLLMs side by side
    {"supervision"},                                   # work that may kill its process, forked
    {"distributed", "bisect",                          # Ray workers; where a finding class began;
     "repro_sampling"},                                # a sampling class's standalone file
    {"selftest", "repro", "replay_run"},               # seeded regressions; a finding as a pytest
                                                       # file; one replay command's run
    {"cli"},                                           # the command line: dispatch, every parser
    {"__main__"},
)
MAX_MODULE_LINES = 400
MAX_ROOM_LINES = 1_500
