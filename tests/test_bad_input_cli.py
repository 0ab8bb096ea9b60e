"""Bad input to every command, run as a user runs it (``python -m simrig ...``):
exit 2, exactly one line on stderr naming the command, the file and what is
wrong, no traceback, and nothing left where the report would have gone.

Every case fails before vLLM is imported, so the whole table costs about a
second per row. ``doctor`` takes no input and is not in the table.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "samples" / "spec_decode.jsonl"
# /proc takes no new entries, not even from root (chmod does not stop root).
UNWRITABLE = "/proc/simrig-no-such-report"


def _files(tmp: Path) -> dict[str, str]:
    """Bad files for the table, written into ``tmp``."""
    data = gzip.decompress((ROOT / "traces" / "recorded" / "chunked.jsonl.gz").read_bytes())
    cut = data.index(b'"', 9000)  # a quote well past the first 8 KiB becomes a byte that is not UTF-8
    late = tmp / "late_bad_utf8.jsonl"
    late.write_bytes(data[:cut] + b"\xff" + data[cut + 1:])
    known = tmp / "known-findings.json"
    known.write_text('{"vllm_version": "0.33.0", "findings": [{"kind": ')
    not_dir = tmp / "a-file"
    not_dir.write_text("x")
    csv = tmp / "azure.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,\n")
    snap = tmp / "snap.json"
    snap.write_text("{")
    truncated = tmp / "cut.jsonl.gz"
    whole = gzip.compress(SAMPLE.read_bytes())
    truncated.write_bytes(whole[: len(whole) // 2])
    return {"LATE": str(late), "KNOWN": str(known), "FILE": str(not_dir), "CSV": str(csv),
            "SNAP": str(snap), "CUT": str(truncated), "OUT": str(tmp / "out"),
            "TRACE": str(SAMPLE), "NOWHERE": str(tmp / "no-such-vllm-checkout")}


# (command line, what the one line must contain); {NAME} from _files
CASES = [
    ("replay {LATE} --out {OUT}", "late_bad_utf8.jsonl:"),
    ("replay {LATE} --out {OUT}", "UTF-8"),
    ("replay {CUT} --out {OUT}", "cut.jsonl.gz:"),
    ("replay {TRACE} --out " + UNWRITABLE, "--out: cannot write in /proc"),
    ("replay {TRACE} --out {FILE}", "exists and is not a directory"),
    ("replay {TRACE} --out {OUT} --known {KNOWN}", "known-findings.json:1: known findings: invalid JSON"),
    ("replay {TRACE} --out {OUT} --pcp-sizes 0", "--pcp-sizes"),
    ("fuzz --budget 5 --out " + UNWRITABLE, "--out: cannot write in /proc"),
    ("fuzz --budget 5 --out {OUT} --known {KNOWN}", "known findings: invalid JSON"),
    ("fuzz --budget 5 --out {OUT} --pcp-sizes 3", "--pcp-sizes"),
    ("fuzz --budget 0 --out {OUT}", "--budget"),
    ("selftest --mutants idx-mapping-host-int32 --out " + UNWRITABLE, "--out: cannot write in /proc"),
    ("selftest --mutants no-such-mutant --out {OUT}", "no-such-mutant"),
    ("selftest --out {OUT} --known {KNOWN}", "known findings: invalid JSON"),
    ("demo --out " + UNWRITABLE, "--out: cannot write in /proc"),
    ("demo --out {OUT} --known {KNOWN}", "known findings: invalid JSON"),
    ("record --workload synthetic:requests=-3 --out {OUT}.jsonl", "requests"),
    ("record --workload synthetic:requests=3 --out " + UNWRITABLE + ".jsonl", "cannot write in /proc"),
    ("import --format azure {CSV} --out {OUT}.jsonl", "azure.csv:2:"),
    ("import --format azure {FILE}.missing --out {OUT}.jsonl", "a-file.missing"),
    ("contract diff {SNAP} {SNAP}", "snap.json:1:"),
    ("contract snapshot --out " + UNWRITABLE + ".json", "cannot write in /proc"),
    ("history --store {FILE}", "a-file"),
    ("env create --vllm 0.1.0", "no Model Runner V2"),
    ("compare --vllm {NOWHERE} --vllm installed {TRACE} --out {OUT}", "no such file or folder"),
    ("compare --vllm installed --vllm installed {TRACE} --out {OUT} --known {KNOWN}",
     "known findings: invalid JSON"),
]


@pytest.mark.parametrize("line, expected", CASES, ids=[f"{i}-{c.split()[0]}" for i, (c, _) in
                                                        enumerate(CASES)])
def test_bad_input_is_one_line_and_exit_2(tmp_path, line, expected):
    files = _files(tmp_path)
    argv = [part.format(**files) for part in line.split()]
    env = {**os.environ, "SIMRIG_HISTORY": str(tmp_path / "history"), "PYTHONWARNINGS": "ignore"}
    env.pop("SIMRIG_KNOWN", None)
    proc = subprocess.run([sys.executable, "-m", "simrig", *argv], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    err_lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(err_lines) == 1, proc.stderr
    assert err_lines[0].startswith(f"simrig {argv[0]}"), err_lines[0]
    assert "Traceback" not in proc.stderr
    assert expected in err_lines[0]
    assert not Path(files["OUT"]).exists()  # no report, not even an empty folder
    assert not (tmp_path / "history").exists()  # and no history row
    assert not list(tmp_path.glob(".tmp-*"))


def test_an_error_while_writing_is_one_line_too(tmp_path, monkeypatch, capsys):
    """An OSError raised past the up-front checks (a disk that fills mid-run)
    still ends in one line naming the file, exit 2."""
    from simrig import cli
    from simrig.cli import history_cmd as history

    def full_disk(args):
        raise OSError(28, "No space left on device", str(tmp_path / "report.html"))

    monkeypatch.setattr(history, "run", full_disk)
    status = cli.main(["history", "--store", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err == [f"simrig history: error: {tmp_path / 'report.html'}: No space left on device"]


def test_a_bug_in_simrig_is_one_line_exit_3_with_the_traceback_kept(tmp_path, monkeypatch, capsys):
    from simrig import cli
    from simrig.cli import history_cmd as history

    def broken(args):
        return {}["no such key"]

    monkeypatch.setattr(history, "run", broken)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    status = cli.main(["history", "--store", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 3
    assert len(err) == 1 and "internal error (a bug in simrig): KeyError" in err[0]
    saved = Path(err[0].rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert saved.parent == tmp_path and "KeyError" in saved.read_text()


def test_the_known_file_flag_is_read_by_the_checker(tmp_path, monkeypatch):
    """--known FILE replaces the committed baselines for this run (and, through
    SIMRIG_KNOWN, for its child processes)."""
    from simrig.findings.known import KNOWN_ENV, load_known_findings

    entry = {"kind": "dtype_drift", "stage": "prepare", "field": "positions", "check": "contract",
             "vllm": ">=0.30.0", "explanation": "a test entry"}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"vllm_version": "0.33.0", "findings": [entry]}))
    monkeypatch.setenv(KNOWN_ENV, str(path))
    known = load_known_findings("0.33.0")
    assert [e.key for e in known.entries] == [("dtype_drift", "prepare", "positions", "contract")]
    monkeypatch.delenv(KNOWN_ENV)
    assert ("dtype_drift", "prepare", "positions", "contract") not in \
        [e.key for e in load_known_findings("0.33.0").entries]


@pytest.mark.vllm
def test_a_config_vllm_itself_refuses_is_one_line_and_exit_2_from_the_supervised_worker(tmp_path):
    """The reader's bounds pass it; vLLM's own SchedulerConfig refuses it in the worker that
    builds the runner (max_num_batched_tokens < max_num_reqs): still bad input, not a rig error
    (this row imports vLLM, so it is not in the table above)."""
    trace = tmp_path / "refused.jsonl"
    trace.write_text(json.dumps({"format": "simrig-trace", "version": 1, "config": {
        "max_num_reqs": 64, "max_num_batched_tokens": 16, "max_model_len": 64}}) + "\n"
        + json.dumps({"step": 0, "new_requests": [{"id": "a", "prompt_len": 4}],
                      "num_scheduled_tokens": {"a": 4}}) + "\n")
    out = tmp_path / "out"
    env = {**os.environ, "SIMRIG_HISTORY": str(tmp_path / "history"), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "simrig", "replay", str(trace), "--quiet", "--no-coverage",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    err_lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2, proc.stderr
    assert err_lines == [f"simrig replay: error: {trace}: config: vLLM's SchedulerConfig refuses it: "
                         "max_num_batched_tokens (16) must be greater than or equal to max_num_seqs (64)."], err_lines
    assert not out.exists() and not (tmp_path / "history").exists()
