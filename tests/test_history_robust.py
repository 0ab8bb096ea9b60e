"""The history store stays readable whatever an append leaves behind, and recording
it never changes a run's exit status (no vLLM)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from simrig.cli import main
from simrig.history import store as history
from simrig.history.store import StoreListing, append_run, load_history, record_history

ROOT = Path(__file__).resolve().parents[1]


def _classes(*signatures: str) -> pd.DataFrame:
    return pd.DataFrame([{"signature": s, "kind": "key_error", "stage": "gather", "field": "",
                          "exception_type": "KeyError", "verdict": "known", "occurrences": 1}
                         for s in signatures])


def _summary(day: int = 1) -> dict:
    return {"command": "replay", "suite": "replay traces/samples",
            "created_utc": f"2026-11-{day:02d}T03:00:00+00:00", "vllm_version": "0.33.0", "exit_status": 0}


def _store(tmp_path: Path, runs: int = 3) -> tuple[Path, list[str]]:
    store = tmp_path / "history"
    return store, [append_run(store, _summary(day), _classes(f"key_error · {day}")) for day in range(1, runs + 1)]


APPENDER = textwrap.dedent("""
    import sys
    import pandas as pd
    from simrig.history.store import append_run
    store, n = sys.argv[1], int(sys.argv[2])
    classes = pd.DataFrame([{"signature": f"k · {i}", "kind": "k", "stage": "gather", "field": "",
                             "exception_type": "", "verdict": "known", "occurrences": 1} for i in range(20)])
    print("ready", flush=True)
    for i in range(n):
        append_run(store, {"command": "fuzz", "suite": "fuzz valid", "exit_status": 0}, classes)
""")


def test_reading_while_another_process_appends_never_fails(tmp_path: Path, capfd) -> None:
    store, n = tmp_path / "history", 60
    proc = subprocess.Popen([sys.executable, "-c", APPENDER, str(store), str(n)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        reads_during, failures, counts = 0, [], []
        while proc.poll() is None:
            try:
                runs, classes = load_history(store)
            except Exception as exc:  # noqa: BLE001 -- counted: the test wants none
                failures.append(repr(exc))
                continue
            reads_during += 1
            counts.append(len(runs))
            # every run read is complete: its 20 classes are there
            assert len(classes) == 20 * len(runs)
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0
    assert failures == []
    assert reads_during >= 2, "the reads must overlap the appends"
    assert counts == sorted(counts)  # runs only ever appear
    runs, classes = load_history(store)
    assert len(runs) == n and runs["run_id"].is_unique and len(classes) == 20 * n
    assert "warning" not in capfd.readouterr().err  # nothing was ever skipped as unreadable


def test_temp_file_and_garbage_run_file_leave_the_store_readable(tmp_path: Path, capsys) -> None:
    store, ids = _store(tmp_path)
    (store / "runs" / ".tmp-k3j2h1.parquet").write_bytes(b"")  # what SIGKILL mid-append leaves
    (store / "classes" / ".tmp-x9y8z7.parquet").write_bytes(b"")
    garbage = store / "runs" / "20261201T000000Z-bad000.parquet"
    garbage.write_bytes(b"this is not parquet\n" * 10)
    listing = StoreListing()
    runs, classes = load_history(store, listing=listing)
    assert list(runs["run_id"]) == ids and len(classes) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"simrig: warning: history: skipped unreadable {garbage} (")
    assert [p.name for p in listing.temporary] == [".tmp-k3j2h1.parquet", ".tmp-x9y8z7.parquet"]
    assert [p for p, _ in listing.unreadable] == [garbage]
    # the command: a page, exit 0, the same warning; --verbose names what it left out
    assert main(["history", "--store", str(store), "--json", "--verbose"]) == 0
    out = capsys.readouterr()
    assert '"runs": 3' in out.out
    lines = out.err.strip().splitlines()
    assert sum("warning" in line and str(garbage) in line for line in lines) == 1
    assert any(".tmp-k3j2h1.parquet: temporary" in line for line in lines)
    assert any(f"{garbage}: unreadable" in line for line in lines)
    # without --verbose only the warning
    assert main(["history", "--store", str(store), "--json"]) == 0
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_parquet_file_that_is_no_history_table_is_skipped(tmp_path: Path, capsys) -> None:
    store, ids = _store(tmp_path)
    pd.DataFrame({"x": [1, 2]}).to_parquet(store / "runs" / "other.parquet")
    pd.DataFrame({"run_id": ["r"], "exit_status": [None]}).to_parquet(store / "runs" / "noexit.parquet")
    runs, _ = load_history(store)
    assert list(runs["run_id"]) == ids
    err = capsys.readouterr().err
    assert "other.parquet" in err and "noexit.parquet" in err and len(err.strip().splitlines()) == 2


def test_orphan_classes_are_ignored_and_listed_as_partial(tmp_path: Path, capsys) -> None:
    store, ids = _store(tmp_path)
    orphan = store / "classes" / "20261202T000000Z-0a0a0a.parquet"
    pd.read_parquet(store / "classes" / f"{ids[0]}.parquet").assign(run_id=orphan.stem).to_parquet(orphan)
    listing = StoreListing()
    runs, classes = load_history(store, listing=listing)
    assert len(runs) == 3 and set(classes["run_id"]) == set(ids)
    assert listing.orphans == [orphan] and capsys.readouterr().err == ""
    assert main(["history", "--store", str(store), "--verbose"]) == 0
    assert f"{orphan}: partial" in capsys.readouterr().err


def test_interrupted_append_leaves_no_orphan(tmp_path: Path, monkeypatch) -> None:
    store, ids = _store(tmp_path, runs=1)
    real = history._write_atomic

    def interrupted_on_the_run_row(frame, path):
        if path.parent.name == "runs":
            raise KeyboardInterrupt
        real(frame, path)

    monkeypatch.setattr(history, "_write_atomic", interrupted_on_the_run_row)
    with pytest.raises(KeyboardInterrupt):
        append_run(store, _summary(2), _classes("key_error · x"))
    listing = StoreListing()
    runs, _ = load_history(store, listing=listing)
    assert list(runs["run_id"]) == ids and listing.orphans == [] and listing.temporary == []
    assert sorted(p.stem for p in (store / "classes").iterdir()) == ids


def test_history_page_uses_its_own_temp_file(tmp_path: Path, capsys) -> None:
    store, _ = _store(tmp_path)
    (store / ".tmp-history.html").mkdir()  # the old fixed temp name, now in the way
    assert main(["history", "--store", str(store)]) == 0
    assert "3 run(s)" in (store / "history.html").read_text()
    assert sorted(p.name for p in store.iterdir()) == [".tmp-history.html", "classes", "history.html", "runs"]
    assert (store / "history.html").stat().st_mode & 0o044  # readable by others, like any report


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("disk\non fire"), OSError(28, "No space left")])
def test_record_history_never_raises(tmp_path: Path, monkeypatch, capsys, error) -> None:
    def failing_append(*_args, **_kwargs):
        raise error

    monkeypatch.setenv("SIMRIG_HISTORY", str(tmp_path / "h"))
    monkeypatch.setattr(history, "append_run", failing_append)
    assert record_history(_summary(), _classes()) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"simrig: warning: history not recorded in {tmp_path / 'h'}: ")
    if isinstance(error, KeyboardInterrupt):
        assert err[0].endswith(": interrupted")


def test_record_history_appends(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SIMRIG_HISTORY", str(tmp_path / "h"))
    record_history(_summary(), _classes("key_error · a"))
    runs, classes = load_history(tmp_path / "h")
    assert len(runs) == 1 and list(classes["signature"]) == ["key_error · a"]
    assert capsys.readouterr().err == ""
