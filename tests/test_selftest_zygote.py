"""Selftest runs forked from one zygote (simrig/supervision/zygote.py): a mutant stays in the
run that applied it, a run past its timeout is killed and the next is served, another
environment gets a zygote of its own, and where none can start a fresh interpreter runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simrig.selftest import mutant_runs
from simrig.selftest.mutant_runs import BASELINE, run_child
from simrig.supervision import zygote

SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "samples"
TRACE = SAMPLES / "sampling_temperature_topk_topp.jsonl"
MUTANT = "sampling-top-k-by-batch-row"  # found by a replay of TRACE (tests/test_sampling_mutants.py)


@pytest.fixture
def fresh_zygote():
    """No zygote left by an earlier test, none left for the next (for the tests that stand
    one in; the others share the process's zygote, as the slow tier's mutant runs do)."""
    zygote._close()
    zygote._current = None
    yield
    zygote._close()
    zygote._current = None


@pytest.mark.vllm
def test_a_mutant_stays_in_its_run_and_one_zygote_serves_both(tmp_path):
    mutated = run_child(MUTANT, budget_s=0, seed=0, baseline=[], traces=[TRACE], out_dir=tmp_path,
                        timeout_s=300)
    assert mutated.error == "" and mutated.detected, mutated
    served_by = zygote._current.proc.pid
    clean = run_child(BASELINE, budget_s=0, seed=0, baseline=[], traces=[TRACE], out_dir=tmp_path,
                      timeout_s=300)
    assert zygote._current.proc.pid == served_by  # no second vLLM import
    # the zygote stayed unmutated: the same trace replays with no new class
    assert clean.error == "" and clean.new_findings == 0, clean
    assert mutated.signature not in clean.signatures


@pytest.mark.vllm
def test_a_run_past_its_timeout_is_killed_and_the_next_is_served(tmp_path):
    late = run_child(BASELINE, budget_s=120, seed=0, baseline=[], traces=[], out_dir=tmp_path,
                     timeout_s=3)
    assert late.error == "child timed out after 3 s" and late.elapsed_s < 60
    served_by = zygote._current.proc.pid
    on_time = run_child(MUTANT, budget_s=0, seed=0, baseline=[], traces=[TRACE], out_dir=tmp_path,
                        timeout_s=300)
    assert on_time.detected and zygote._current.proc.pid == served_by


@pytest.mark.vllm
def test_a_run_that_fails_reports_its_exit_status_and_stderr(tmp_path):
    """What a fresh interpreter's exit status and stderr said comes back through the zygote."""
    spec = tmp_path / "spec.json"
    spec.write_text("{}")  # no mutant named: child.main raises before it writes a result
    exited = zygote.run("simrig.selftest.child", [str(spec), str(tmp_path / "result.json")], tmp_path,
                        timeout_s=60)
    assert exited is not None and exited.returncode == 1, exited
    assert exited.stderr.rstrip().endswith("KeyError: 'mutant'"), exited.stderr


def test_another_environment_gets_a_zygote_of_its_own(monkeypatch, fresh_zygote):
    started = []

    class Recorded:
        def __init__(self, key):
            self.key, self.ready, self.proc = key, True, type("P", (), {"poll": lambda self: None})()
            started.append(self)

        def run(self, module, args, folder, timeout_s, cwd):
            return zygote.Exited(0, "", "")

        def close(self):
            self.closed = True

    monkeypatch.setattr(zygote, "_Zygote", Recorded)
    zygote.run("m", [], Path("f"), 1)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # not part of the key
    zygote.run("m", [], Path("f"), 1)
    assert len(started) == 1
    monkeypatch.setenv("SIMRIG_MEMCHECK", "0" if os.environ.get("SIMRIG_MEMCHECK") == "1" else "1")
    zygote.run("m", [], Path("f"), 1)
    assert len(started) == 2 and started[0].closed and zygote._current is started[1]


def test_where_no_zygote_starts_a_fresh_interpreter_runs_the_child(monkeypatch, tmp_path, fresh_zygote):
    class NeverReady:
        def __init__(self, key):
            self.ready = False

        def close(self):
            pass

    ran = []

    def fake_run(argv, **kwargs):
        ran.append(argv)
        return type("Done", (), {"returncode": 1, "stdout": "", "stderr": "ImportError: no vllm"})()

    monkeypatch.setattr(zygote, "_Zygote", NeverReady)
    monkeypatch.setattr(mutant_runs.subprocess, "run", fake_run)
    result = run_child(MUTANT, budget_s=0, seed=0, baseline=[], traces=[], out_dir=tmp_path, timeout_s=5)
    assert ran and ran[0][1:3] == ["-m", "simrig.selftest.child"]
    assert result.error == "child exited 1: ImportError: no vllm"
    assert zygote._current is None


def test_a_fork_exits_as_sys_exit_would_with_what_main_returned():
    assert [zygote._exit_code(v) for v in (None, 0, 1, 3, "a message")] == [0, 0, 1, 3, 1]
