"""`--workers` and `--ray` as a user runs them: the sharded paths end like the
one-process ones (exit status, --json keys, report tables, history row), and
an address that is not Ray is refused within a bounded wait.

The Ray-backed tests start a local Ray (marker ``cluster``, `make test-cluster`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from simrig.cli import main

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _simrig(args: list[str], env: dict[str, str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "simrig", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


# ---------------------------------------------------------------- --ray ADDRESS that is not Ray
@pytest.fixture
def web_server():
    """A throw-away `python -m http.server` on a free port."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "http.server never listened"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("command", [["fuzz", "--budget", "5"], ["replay", "traces/samples"]])
def test_ray_address_of_a_web_server_is_refused_in_one_line(tmp_path, web_server, command):
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    out = tmp_path / "out"
    env = dict(os.environ, SIMRIG_RAY_TIMEOUT="20")
    done, _ = _simrig([*command, "--workers", "2", "--ray", web_server, "--out", str(out)], env,
                      timeout=120)  # a hang (what ray.init does here) fails the test
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ray" in lines[0] and "not a Ray cluster" in lines[0], lines
    assert not out.exists()


def test_ray_address_that_never_answers_is_given_up_after_the_bound(tmp_path):
    """A listener that accepts and says nothing: refused once SIMRIG_RAY_TIMEOUT is spent."""
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = "127.0.0.1:%d" % silent.getsockname()[1]
        env = dict(os.environ, SIMRIG_RAY_TIMEOUT="3")
        done, took = _simrig(["fuzz", "--workers", "1", "--ray", address, "--budget", "5",
                              "--out", str(tmp_path / "out")], env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "did not answer as a Ray cluster within 3 s" in lines[0], lines
    assert took >= 3  # it waited for the bound, and (timeout above) not for ever
    assert not (tmp_path / "out").exists()


def test_a_bad_ray_timeout_is_a_usage_error(tmp_path):
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    env = dict(os.environ, SIMRIG_RAY_TIMEOUT="soon")
    done, _ = _simrig(["fuzz", "--workers", "1", "--ray", "127.0.0.1:1", "--budget", "5",
                       "--out", str(tmp_path / "out")], env, timeout=120)
    assert done.returncode == 2 and "SIMRIG_RAY_TIMEOUT" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- sharded == one process
def _history_runs(store: Path) -> pd.DataFrame:
    return pd.read_parquet(store / "runs")


def _json(out: str) -> dict:
    return json.loads(out)  # stdout must be the summary and nothing else


@pytest.mark.vllm
@pytest.mark.cluster
def test_sharded_replay_ends_like_the_one_process_replay(tmp_path, capsys):
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    common = ["replay", "traces/samples", "--stages", "gather,dummy", "--quiet", "--json", "--no-coverage"]
    one_status = main([*common, "--out", str(tmp_path / "one")])
    one = _json(capsys.readouterr().out)
    two_status = main([*common, "--workers", "2", "--out", str(tmp_path / "two")])
    captured = capsys.readouterr()
    two = _json(captured.out)
    assert "Traceback" not in captured.err
    assert two_status == one_status == one["exit_status"] == two["exit_status"]
    assert set(one) <= set(two), set(one) - set(two)
    assert one["classes"] == two["classes"] and one["classes"]["classes"] > 0
    columns = ["signature", "verdict", "occurrences", "first_trace", "first_step", "last_trace",
               "last_step", "reproduce", "explanation"]
    a = pd.read_csv(tmp_path / "one" / "classes.csv", keep_default_na=False)[columns]
    b = pd.read_csv(tmp_path / "two" / "classes.csv", keep_default_na=False)[columns]
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.vllm
@pytest.mark.cluster
def test_sharded_fuzz_ends_like_the_one_process_fuzz(tmp_path, capsys, monkeypatch):
    """One worker, the same seed and examples: the same classes with the same
    counts, the same exit status and --json keys, and a history row each."""
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    store = tmp_path / "history"
    monkeypatch.setenv("SIMRIG_HISTORY", str(store))
    common = ["fuzz", "--mode", "adversarial", "--seed", "4", "--max-examples", "8",
              "--steps-per-example", "6", "--pcp-sizes", "1", "--stages", "gather",
              "--database", "none", "--no-regressions", "--quiet", "--json"]
    one_status = main([*common, "--out", str(tmp_path / "one")])
    one = _json(capsys.readouterr().out)
    two_status = main([*common, "--workers", "1", "--out", str(tmp_path / "two")])
    two = _json(capsys.readouterr().out)
    assert one_status == two_status == one["exit_status"] == two["exit_status"]
    assert set(one) <= set(two), set(one) - set(two)
    assert two["workers"] == 1 and two["report"] == str(tmp_path / "two")
    for key in ("examples", "steps", "findings", "finding_classes", "classes", "stopped_by",
                "findings_by_kind", "loud_rejections"):
        assert one[key] == two[key], key
    assert one["findings"] > 0 and one["stopped_by"] == "max_examples" and one["repeatable"]
    columns = ["signature", "verdict", "occurrences", "first_example", "first_step"]
    a = pd.read_csv(tmp_path / "one" / "classes.csv", keep_default_na=False)
    b = pd.read_csv(tmp_path / "two" / "classes.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(a[columns], b[columns])
    assert (b.occurrences > 1).any()  # true counts, not one row per class
    findings = pd.read_csv(tmp_path / "two" / "findings.csv", keep_default_na=False)
    assert findings["count"].sum() == b.occurrences.sum()
    runs = _history_runs(store)
    assert sorted(runs["command"]) == ["fuzz", "fuzz"]


@pytest.mark.vllm
@pytest.mark.cluster
def test_sharded_rig_error_and_signals_during_the_write(tmp_path, monkeypatch):
    """A shard's own code raises: exit 3, stopped by rig_error, the class in the
    table; SIGINT and SIGTERM while the driver writes the report are ignored."""
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    import operator
    from functools import partial

    from hypothesis import strategies as st

    from simrig.campaign import campaign_report
    from simrig.campaign.fuzz import CampaignOptions
    from simrig.distributed.fuzz_shards import ShardedCampaign

    real_junit = campaign_report.junit_xml

    def junit(campaign):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        return real_junit(campaign)

    monkeypatch.setattr(campaign_report, "junit_xml", junit)
    out = tmp_path / "out"
    options = CampaignOptions(out_dir=out, progress="quiet", database=None, replay_regressions=False,
                              max_examples=4, budget_s=None, pcp_sizes=(1,),
                              configs=st.just(0).map(partial(operator.truediv, 1)))
    sharded = ShardedCampaign(options, workers=1)
    assert sharded.run() == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "rig_error" and summary["exit_status"] == 3
    assert (out / "junit.xml").is_file() and (out / "shards.csv").is_file()
    classes = pd.read_csv(out / "classes.csv", keep_default_na=False)
    rig = classes[classes.kind == "rig_error"]
    assert rig.exception_type.tolist() == ["ZeroDivisionError"] and rig.verdict.tolist() == ["new"]
    assert pd.read_csv(out / "shards.csv").status.tolist() == ["error"]


@pytest.mark.vllm
@pytest.mark.cluster
def test_sharded_replay_stopped_at_once_gives_an_empty_result_not_a_crash():
    """What Ctrl-C before any unit came back leaves: a result with no steps, whole tables."""
    pytest.importorskip("ray", reason="the simrig[ray] extra is not installed")
    from simrig.distributed.replay_shards import replay_sharded
    from simrig.replay import expand_trace_paths

    merged = replay_sharded(expand_trace_paths([REPO / "traces/samples"]), workers=1, address=None,
                            pcp_sizes=None, stages=("gather",), stop=lambda: True)
    result = merged.result
    assert result.num_steps == 0 and merged.units == []
    assert result.classes is not None and len(result.classes) == 0
    assert "verdict" in result.classes.columns and result.exit_status == 0
