"""The pytest plugin as a vLLM developer meets it: the docstring's pattern, as written.

``test_runner_accepts_valid_schedules`` below is the plugin docstring's test,
character for character, with default Hypothesis settings. The second test
runs the same file in a fresh pytest process under a selftest mutant and reads
what the developer would read.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings

from strategies import scheduled_runs  # (config, [Step, ...]) valid under config

pytestmark = pytest.mark.vllm


# The docstring's pattern with its default deadline runs as written in the subprocess test
# below; here, beside another xdist worker, a loaded machine must not fail it on time alone.
@settings(deadline=None)
@given(scheduled_runs())
def test_runner_accepts_valid_schedules(simrig_run, run):
    simrig_run(run)


DOCSTRING_TEST = '''
from hypothesis import given
from strategies import scheduled_runs          # (config, [Step, ...]) valid under config

@given(scheduled_runs())
def test_runner_accepts_valid_schedules(simrig_run, run):
    simrig_run(run)
'''

MUTANT_CONFTEST = '''
import pytest

@pytest.fixture(scope="session", autouse=True)
def _seeded_regression(simrig_api):
    from simrig.selftest.catalogue import BY_NAME
    from simrig.vllm_runtime import mutate

    mutate.apply(BY_NAME["idx-mapping-host-int32"])
'''


@pytest.mark.slow
def test_docstring_pattern_fails_readably_under_a_mutant(tmp_path):
    import simrig.campaign.pytest_plugin as plugin

    assert "def test_runner_accepts_valid_schedules(simrig_run, run):\n        simrig_run(run)" \
        in plugin.__doc__
    (tmp_path / "test_vllm_runner.py").write_text(textwrap.dedent(DOCSTRING_TEST))
    (tmp_path / "conftest.py").write_text(MUTANT_CONFTEST)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_vllm_runner.py")],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "simrig: 1 new finding class" in out, out[-3000:]
    assert "[NEW]" in out and "dtype_drift · gather · idx_mapping_np" in out
    assert "Traceback" not in out and "function_scoped_fixture" not in out
    trace = tmp_path / ".simrig" / "failures" / "test_runner_accepts_valid_schedules.jsonl"
    assert trace.is_file() and f"simrig replay {trace}" in out
    from simrig.trace_io.trace import read_trace

    header, steps = read_trace(trace)
    assert 1 <= len(steps) <= 2  # shrunk: the first step already shows the int32 mapping


COVERAGE_TEST = '''
from hypothesis import given, settings
from strategies import scheduled_runs


@settings(max_examples=3, deadline=None)
@given(scheduled_runs())
def test_runner_accepts_valid_schedules(simrig_run, run):
    simrig_run(run)
'''


@pytest.mark.slow
def test_simrig_coverage_writes_the_coverage_of_a_pytest_session(tmp_path):
    (tmp_path / "test_cov.py").write_text(COVERAGE_TEST)
    out = tmp_path / "cov"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "--simrig-coverage", str(out),
                           str(tmp_path / "test_cov.py")],
                          check=False, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "simrig coverage:" in proc.stdout and "of lines" in proc.stdout
    import json

    import pandas as pd

    summary = json.loads((out / "summary.json").read_text())["coverage"]
    assert summary["lines_reached"] > 0
    functions = pd.read_parquet(out / "coverage_functions.parquet")
    # simrig_run's default stages are gather and dummy: both are driven functions
    assert {"GPUModelRunner.gather_batch_req_state", "InputBatch.make_dummy"} <= set(functions.function)
    assert "Coverage of the MRV2 code" in (out / "coverage.html").read_text()
