"""A campaign survives what it finds: its worker may die (a signal), hang (no
stage opened for the timeout) or exit; the supervisor tells which, and a
crash becomes a finding class while the campaign goes on.

The fast tests fork plain children; the slow one seeds a fault of our own
into vLLM (add_requests dies of SIGSEGV half-way through its adds, as a
write far past a staged-write buffer would) and runs ``simrig fuzz``.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from simrig import lifeline
from simrig.lifeline import wait_child
from simrig.vllm_runtime.mutate import Mutant
from tests import mutant_cli

REPO = Path(__file__).resolve().parents[1]


def _fork(body) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid


def test_a_child_that_segfaults_is_a_crash_named_by_its_signal():
    import signal

    def die():
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)
        ctypes.string_at(1)

    assert wait_child(_fork(die), lifeline.Lifeline(), 30) == ("crash", "SIGSEGV")


def test_an_exit_status_passes_through():
    assert wait_child(_fork(lambda: os._exit(7)), lifeline.Lifeline(), 30) == ("exit", 7)


def test_a_child_that_stops_beating_is_killed_as_a_hang_and_one_that_beats_is_not():
    line = lifeline.Lifeline()

    def beat_then_hang():
        lifeline.install(line)
        for i in range(8):  # 1.6 s of beats: longer than the timeout, never killed meanwhile
            lifeline.mark_stage(f"stage{i}")
            time.sleep(0.2)
        time.sleep(60)

    start = time.monotonic()
    how, what = wait_child(_fork(beat_then_hang), line, 1.0)
    assert how == "crash" and what.startswith("hang") and 2.0 < time.monotonic() - start < 10
    assert line.read().stage == "stage7"


def test_the_lifeline_page_holds_step_example_and_stage():
    line = lifeline.Lifeline()
    lifeline.install(line)
    try:
        lifeline.mark_step(3, 12)
        lifeline.mark_stage("prepare")
    finally:
        lifeline.install(None)
    reading = line.read()
    assert (reading.step, reading.example, reading.stage) == (3, 12, "prepare") and reading.beats == 2


SEEDED = Mutant(
    "add-requests-segfault-at-slot-3", "vllm.v1.worker.gpu.model_runner", "GPUModelRunner.add_requests",
    "req_index = self.req_states.req_id_to_index[req_id]\n",
    "req_index = self.req_states.req_id_to_index[req_id]\n"
    "        if req_index >= 3:  # a write far past a staged-write buffer, half-way through the adds\n"
    "            __import__('ctypes').string_at(1)\n",
    "add_requests dies of SIGSEGV when it adds a request into slot 3 or above")


@pytest.mark.vllm
@pytest.mark.slow
def test_a_campaign_whose_worker_segfaults_writes_a_complete_report_and_exits_1(tmp_path):
    out = tmp_path / "fuzz"
    proc = mutant_cli.run(["fuzz", "--max-examples", "6", "--seed", "1", "--database", "none",
                           "--no-regressions", "--no-coverage", "--pcp-sizes", "1", "--progress", "quiet",
                           "--out", str(out)], SEEDED)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_status"] == 1 and summary["crashes"] >= 1 and summary["examples"] == 6
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    crash = classes[classes["kind"] == "crash"]
    assert list(crash["signature"]) == ["crash · lifecycle · SIGSEGV"] and list(crash["verdict"]) == ["new"]
    assert (classes["verdict"] == "known").any()  # what the workers found before dying is kept
    shrunk = out / "shrunk" / "crash-lifecycle-SIGSEGV.jsonl"
    assert shrunk.is_file() and "<failure" in (out / "junit.xml").read_text()
    findings = pd.read_csv(out / "findings.csv", keep_default_na=False)
    row = findings[findings["kind"] == "crash"].iloc[0]
    assert row["reproduced"] == "True" and row["shrunk_steps"] >= 1
    assert "worker died (SIGSEGV) in lifecycle" in proc.stderr
    assert not list(tmp_path.glob(".fuzz-supervise-*"))  # the supervisor's state is gone


@pytest.mark.vllm
@pytest.mark.slow
def test_a_replay_whose_worker_segfaults_goes_on_with_the_next_trace(tmp_path):
    out = tmp_path / "rep"
    traces = [str(REPO / "traces" / "samples" / name) for name in ("chunked_prefill.jsonl", "two_kv_groups.jsonl")]
    proc = mutant_cli.run(["replay", *traces, "--no-coverage", "--quiet", "--out", str(out)], SEEDED)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["crashes"] == 1 and summary["exit_status"] == 1
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    crash = classes[classes["kind"] == "crash"].iloc[0]
    assert (crash["signature"], crash["verdict"]) == ("crash · lifecycle · SIGSEGV", "new")
    assert crash["first_trace"].endswith("chunked_prefill.jsonl")  # its 3-request first step dies
    steps = pd.read_csv(out / "steps.csv", keep_default_na=False)
    assert set(steps["trace"].map(lambda t: Path(t).name)) == {"two_kv_groups.jsonl"}  # replayed after it
    assert "worker died (SIGSEGV) in lifecycle at step 0 of" in proc.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_selftest_counts_a_mutant_that_kills_its_child_as_detected_by_a_crash(tmp_path, capsys):
    from simrig.cli import main

    out = tmp_path / "board"
    status = main(["selftest", "--mutants", "add-requests-segfault-half-way", "--budget-per-mutant", "60",
                   "--skip-baseline", "--out", str(out)])
    assert status == 0, capsys.readouterr()
    row = pd.read_csv(out / "scoreboard.csv").set_index("mutant").loc["add-requests-segfault-half-way"]
    assert (row.status, row.kind, row.via) == ("detected", "crash", "crash")
    assert "SIGSEGV" in row.signature and (out / "summary.json").is_file()


SITE_FAULT = textwrap.dedent('''
    # every Python process of this test (the driver and each Ray worker) loads vLLM with the
    # seeded fault in place
    import simrig.adapters.runner as _runner

    _load = _runner.load

    def load(*args, **kwargs):
        api = _load(*args, **kwargs)
        from simrig.selftest.catalogue import BY_NAME
        from simrig.vllm_runtime import mutate

        if not getattr(_runner, "_fault_applied", False):
            mutate.apply(BY_NAME["add-requests-segfault-half-way"])
            _runner._fault_applied = True
        return api

    _runner.load = load
''')


@pytest.mark.cluster
@pytest.mark.vllm
def test_a_sharded_campaign_whose_worker_segfaults_records_a_crash_class(tmp_path):
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE_FAULT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    env.pop("RAY_ADDRESS", None)  # a Ray of its own: its workers must start with the fault's PYTHONPATH
    out = tmp_path / "fuzz"
    # one worker: the sharded path whole (a lost worker, its replacement, the crash class) with
    # half the workers to start, each a vLLM import
    proc = subprocess.run([sys.executable, "-m", "simrig", "fuzz", "--workers", "1", "--max-examples", "4",
                           "--seed", "1", "--database", "none", "--no-regressions", "--no-coverage",
                           "--pcp-sizes", "1", "--progress", "quiet", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["crashes"] >= 1 and summary["exit_status"] == 1
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    crash = classes[classes["kind"] == "crash"]
    assert len(crash) >= 1 and set(crash["verdict"]) == {"new"}
    assert set(crash["stage"]) == {"lifecycle"}, crash[["signature"]]
    assert list((out / "shrunk").glob("crash-lifecycle-*.jsonl"))
    assert not list(tmp_path.glob(".fuzz-shards-*"))


def test_a_new_worker_resumes_every_class_and_applies_each_crash_once(tmp_path):
    """The checkpoint a dead worker left, and the crash the supervisor recorded, are what the
    next worker starts from (no vLLM here: the classes are put in by hand)."""
    from simrig.campaign import shrink
    from simrig.campaign.fuzz import CampaignOptions, FindingClass
    from simrig.findings.classes import Where
    from simrig.findings.findings import Finding
    from simrig.step import NewRequest, RunnerConfig, Step
    from simrig.supervision import forked
    from simrig.supervision.campaign_worker import SupervisedCampaign

    options = CampaignOptions(out_dir=tmp_path / "out", progress="quiet", database=None, max_examples=5)
    first = SupervisedCampaign(options, tmp_path)
    found = Finding(kind="value_mismatch", step=0, stage="prepare", check="reference", field="positions",
                    message="positions differ")
    cls = FindingClass(shrink.class_key(found), found, count=2, config=RunnerConfig(),
                       steps=[Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4})])
    first.classes[cls.key] = cls
    first.tally.add(found, Where("example-0", example=0), count=2)
    first.stats.examples, first.stats.chunks = 3, 2
    first.checkpoint()
    steps = [Step(new_requests=[NewRequest("b", 4), NewRequest("c", 4)], num_scheduled_tokens={"b": 4, "c": 4})]
    forked.dump(tmp_path / "crashes.pkl", [{
        "signal": "SIGSEGV", "stage": "lifecycle", "step": 0, "example": 3, "steps": steps,
        "config": RunnerConfig(), "violations": {}, "chunks": 3, "elapsed_s": 1.5}])
    second = SupervisedCampaign(options, tmp_path)
    assert cls.key in second.classes and second.classes[cls.key].count == 2
    crash = [c for c in second.classes.values() if c.key[0] == "crash"]
    assert len(crash) == 1 and crash[0].key[:4] == ("crash", "lifecycle", "", "SIGSEGV")
    assert crash[0].steps == steps and crash[0].failing and crash[0].key in second.tolerated
    assert (second.stats.crashes, second.stats.examples, second.stats.chunks) == (1, 4, 3)
    assert second.exit_status() == 1
    second.checkpoint()  # the crash is in this checkpoint now: a third worker applies it no more
    third = SupervisedCampaign(options, tmp_path)
    assert third.stats.crashes == 1 and third.classes[crash[0].key].count == 1
