"""Sharded replay and fuzz on a local Ray against the real vLLM.

The tests join the session's Ray (tests/conftest.py); those that run the command
in this process reuse its workers, vLLM already imported. Campaign budgets are a few
seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.vllm, pytest.mark.cluster]
CLASS_COLUMNS = ["trace", "pcp_size", "kind", "stage", "field", "exception_type", "known"]


def _classes(result) -> Counter:
    f = result.findings
    return Counter(tuple(str(v) for v in row) for row in f[CLASS_COLUMNS].itertuples(index=False))


def _replay_pair(paths, stages, segment_steps=None):
    from simrig.distributed.replay_shards import replay_sharded
    from simrig.replay import expand_trace_paths, replay_traces

    paths = expand_trace_paths(paths)
    one = replay_traces(paths, stages=stages)
    sharded = replay_sharded(paths, workers=2, address=None, pcp_sizes=None, stages=stages,
                             segment_steps=segment_steps)
    return one, sharded


def test_replay_on_two_workers_matches_one_process():
    stages = ("gather", "dummy")
    one, sharded = _replay_pair([REPO / "traces/samples", REPO / "traces/recorded"], stages)
    many = sharded.result
    assert len(sharded.units) >= 12  # every trace x PCP size is a unit
    assert many.num_steps == one.num_steps
    assert _classes(many) == _classes(one) and sum(_classes(one).values()) > 0
    assert many.summary()["findings_by_kind"] == one.summary()["findings_by_kind"]
    assert many.summary()["known_not_listed"] == one.summary()["known_not_listed"]
    assert many.contract["count"].tolist() == one.contract["count"].tolist()


def test_segments_with_resync_steps_give_the_unsplit_classes():
    paths = [REPO / "traces/recorded/pcp2.jsonl.gz", REPO / "traces/recorded/mixed.jsonl.gz"]
    one, sharded = _replay_pair(paths, ("gather", "prepare", "partition", "dummy"), segment_steps=25)
    starts = [u.unit.start for u in sharded.units]
    assert sum(s > 0 for s in starts) >= 4  # both traces really were cut
    many = sharded.result
    assert many.num_steps == one.num_steps
    # The same classes; their counts may differ near a cut: the resync step re-sends each
    # held request with all its tokens, so its next token runs as a one-token prefill
    # where the unsplit replay has a decode (dummy/real prefill_runs_as_decode_np parity).
    assert set(_classes(many)) == set(_classes(one)) and _classes(one)
    steps = many.steps[["trace", "step"]].drop_duplicates()
    assert sorted(steps.step[steps.trace.str.endswith("mixed.jsonl.gz")]) == list(range(71))


def _fuzz(tmp_path: Path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "simrig", "fuzz", "--workers", "2", "--mode", "adversarial",
           "--progress", "plain", "--steps-per-example", "8", "--no-coverage", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Lines:
    """The driver's stderr, read on a thread; wait for a line that matches."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if predicate(line):
                    return line
            time.sleep(0.2)
        raise AssertionError(f"no such line in {self.lines}")


def _found(lines: list[str], shard: str) -> set[str]:
    prefix = f"fuzz: shard {shard} found "
    return {line[len(prefix):].split(" (")[0] for line in lines if line.startswith(prefix)}


def _report_classes(out: Path) -> pd.DataFrame:
    f = pd.read_csv(out / "findings.csv", keep_default_na=False)
    f["cls"] = (f.kind + ":" + f.stage + ":" + f.field.astype(str) + ":" + f.exception_type.astype(str))
    return f


def test_two_worker_campaign_shares_one_example_database(tmp_path, capsys):
    """Each shard saves the failures it shrinks into the driver's database and the next
    campaign's shards read it first (Hypothesis' reuse phase), each under its own key (its
    PCP slice). Which shard saves is timing: a shard skips a class another shard already
    shrank, so a shard whose worker started late (a fresh worker importing vLLM while the
    other's was warm) may find nothing left to shrink and save nothing. So: the shards
    together saved, every shard consulted the shared database in the next campaign, and every
    shard that saved read its entries back. Both campaigns run in this process, on the
    session's warm workers."""
    from simrig.cli import main
    from simrig.findings.known import installed_vllm_version

    db = tmp_path / "db"
    saved: dict[str, int] = {}
    for run in (1, 2):
        out = tmp_path / f"run{run}"
        status = main(["fuzz", "--workers", "2", "--mode", "adversarial", "--progress", "quiet",
                       "--steps-per-example", "8", "--no-coverage", "--budget", "4", "--out", str(out),
                       "--database", str(db), "--no-regressions"])
        assert status == 0, capsys.readouterr().err[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        shards = pd.read_csv(out / "shards.csv")
        assert shards.status.tolist() == ["done", "done"] and (shards.examples > 0).all()
        assert summary["workers"] == 2 and summary["finding_classes"] > 0
        assert summary["vllm_version"] == installed_vllm_version()  # as the shards ran it
        assert (out / "junit.xml").read_text().count("<testcase") == summary["finding_classes"]
        if run == 1:
            saved = summary["database"]["saved_by_shard"]
            assert set(saved) <= {"s0", "s1"} and saved and min(saved.values()) > 0, saved
            assert any(db.rglob("*")), "entries land in the persistent database folder"
        else:
            fetched = summary["database"]["fetched_by_shard"]
            assert set(fetched) == {"s0", "s1"}, fetched  # both read the shared database first
            assert all(fetched[shard] > 0 for shard in saved), (saved, fetched)


def test_a_killed_worker_loses_nothing_it_reported(tmp_path):
    """30 examples a shard (not a budget; shrink runs are not counted): s1 is killed right after
    its first class, while it still shrinks it (a shard runs a few to a dozen examples a second,
    the kill follows the class's line within a second or two), so examples are left to reassign
    to s1.1 as a budget's seconds were; s0 and s1.1 then end on the count, not the clock. The worker's
    death is itself a finding: simrig cannot tell a kill from outside from a crash in vLLM's
    code, so the example it died in is a crash class (exit 1)."""
    out = tmp_path / "out"
    proc = _fuzz(tmp_path, "--max-examples", "30", "--out", str(out), "--database", "none",
                 "--no-regressions")
    lines = Lines(proc)
    started = lines.wait_for(lambda l: l.startswith("fuzz: shard s1 started on "))
    lines.wait_for(lambda l: l.startswith("fuzz: shard s1 found "))
    pid = int(started.split(" started on ")[1].split("/")[0].rsplit(":", 1)[1])
    reported = _found(lines.lines, "s1")
    os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=300)
    lines.thread.join(timeout=10)
    assert proc.returncode == 1, "\n".join(lines.lines[-30:])  # the crash class, nothing else new
    shards = pd.read_csv(out / "shards.csv", keep_default_na=False).set_index("shard")
    assert shards.loc["s1", "status"] == "lost" and "reassigned to s1.1" in shards.loc["s1", "note"]
    assert shards.loc["s1.1", "status"] == "done" and shards.loc["s0", "status"] == "done"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lost_shards"] == ["s1"] and summary["crashes"] == 1
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    new = classes[classes["verdict"] == "new"]
    assert list(new["kind"]) == ["crash"] and new["signature"].iloc[0].endswith("WorkerCrashedError"), new
    findings = _report_classes(out)
    kept = {c for c, by in zip(findings.cls, findings.found_by) if "s1" in by.split(",")}
    assert reported and reported <= kept, (reported, kept)


def test_sigint_on_the_driver_stops_every_shard_and_writes_all_found(tmp_path):
    out = tmp_path / "out"
    proc = _fuzz(tmp_path, "--budget", "300", "--out", str(out), "--database", "none",
                 "--no-regressions")
    lines = Lines(proc)
    lines.wait_for(lambda l: l.startswith("fuzz: shard s0 found "))
    lines.wait_for(lambda l: l.startswith("fuzz: shard s1 found "))
    before = _found(lines.lines, "s0") | _found(lines.lines, "s1")
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert time.monotonic() - sent < 100  # far less than the 300 s budget
    assert proc.returncode == 0, "\n".join(lines.lines[-30:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "signal"
    shards = pd.read_csv(out / "shards.csv")
    assert set(shards.status) == {"interrupted"}
    assert before <= set(_report_classes(out).cls)


def test_selftest_on_two_workers_gives_the_one_process_scoreboard(tmp_path):
    """Same mutants, same inputs: the same scoreboard apart from timings."""
    from simrig.cli import main

    common = ["selftest", "--mutants", "getitem-to-get,idx-mapping-host-int32",
              "--budget-per-mutant", "90", "--skip-baseline"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    assert main([*common, "--workers", "2", "--out", str(tmp_path / "two")]) == 0
    content = ["mutant", "status", "via", "kind", "signature", "applied", "detected", "target",
               "shrunk_steps", "message"]
    one = pd.read_csv(tmp_path / "one" / "scoreboard.csv", keep_default_na=False)[content]
    two = pd.read_csv(tmp_path / "two" / "scoreboard.csv", keep_default_na=False)[content]
    assert one.status.tolist() == ["detected", "detected"]
    pd.testing.assert_frame_equal(one, two)
