"""'Since the previous run' compares a run with the previous run of its suite on the same
vLLM release; across releases only when asked (``--across-releases``). Stores built from
hand-made rows, no vLLM."""

from __future__ import annotations

import pandas as pd
import pytest

from simrig.cli.dispatch import build_parser
from simrig.history.changes import changes_line, since_previous
from simrig.history.store import append_run
from simrig.views.changes_text import change_lines, previous_label


def _classes(*signatures: str) -> pd.DataFrame:
    return pd.DataFrame([{"signature": s, "kind": s.split(" · ")[0], "stage": "gather", "field": "",
                          "exception_type": "", "verdict": "known", "occurrences": 1} for s in signatures])


def _summary(version: str, day: int | None = None, **extra) -> dict:
    summary = {"command": "fuzz", "suite": "fuzz valid", "vllm_version": version, **extra}
    if day is not None:
        summary["created_utc"] = f"2026-12-{day:02d}T03:00:00+00:00"
    return summary


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("SIMRIG_ACROSS_RELEASES", raising=False)
    store = tmp_path / "history"
    ids = [append_run(store, _summary("0.33.0", 1, examples_per_s=2.0), _classes("k · a")),
           append_run(store, _summary("0.33.0", 2, examples_per_s=2.0), _classes("k · a", "k · b"))]
    return store, ids


def test_the_first_run_on_a_release_is_compared_with_nothing(store):
    """The issue's campaign: 0.31.0 in a side venv after nightly 0.33.0 runs. Its 27 classes
    were '27 class(es) new since the previous run'; now nothing is new since anything."""
    root, _ = store
    found = _classes(*(f"dtype_drift · f{i}" for i in range(27)))
    changes = since_previous(_summary("0.31.0"), found, root)
    assert changes == {"status": "first", "suite": "fuzz valid", "vllm": "0.31.0", "any_release": False,
                       "other_releases": ["0.33.0"]}
    line = ("first run of fuzz valid on vLLM 0.31.0: nothing to compare with (its runs on vLLM 0.33.0 "
            "are compared only with --across-releases)")
    assert change_lines(changes) == [line]
    assert changes_line({"since_previous": changes}) == line and previous_label(changes) == ""


def test_a_run_is_compared_with_the_previous_run_on_its_own_release(store):
    root, ids = store
    append_run(root, _summary("0.31.0", 3), _classes(*(f"dtype_drift · f{i}" for i in range(27))))
    changes = since_previous(_summary("0.33.0", examples_per_s=2.0), _classes("k · a", "k · b"), root)
    assert (changes["status"], changes["previous_run"], changes["vllm"]) == ("compared", ids[1], "0.33.0")
    assert changes["appeared"] == [] and changes["gone"] == []
    assert changes_line({"since_previous": changes}) == (
        "since the previous run of fuzz valid on vLLM 0.33.0: nothing changed: the same classes and "
        "the same numbers")
    assert previous_label(changes) == ("previous run of fuzz valid on vLLM 0.33.0: 2026-12-02 03:00 UTC "
                                       "(exit 0)")


def test_across_releases_only_when_asked(store, monkeypatch):
    root, _ = store
    third = append_run(root, _summary("0.31.0", 3), _classes(*(f"dtype_drift · f{i}" for i in range(27))))
    now = _classes("k · a", "k · b")
    changes = since_previous(_summary("0.33.0"), now, root, any_release=True)
    assert (changes["previous_run"], changes["previous_vllm"]) == (third, "0.31.0") and changes["any_release"]
    assert (changes["appeared_count"], changes["gone_count"]) == (2, 27)
    assert changes_line({"since_previous": changes}).startswith(
        "since the previous run of fuzz valid on any vLLM release: 2 class(es) new since then; "
        "27 class(es) gone")
    assert previous_label(changes) == ("previous run of fuzz valid on any vLLM release: 2026-12-03 03:00 UTC "
                                       "(vLLM 0.31.0, exit 0)")
    monkeypatch.setenv("SIMRIG_ACROSS_RELEASES", "1")  # what --across-releases sets for the command
    assert since_previous(_summary("0.33.0"), now, root)["previous_run"] == third
    monkeypatch.setenv("SIMRIG_ACROSS_RELEASES", "0")
    assert since_previous(_summary("0.33.0"), now, root)["previous_vllm"] == "0.33.0"


def test_a_suite_never_run_before_says_so_across_releases(tmp_path):
    changes = since_previous(_summary("0.33.0"), _classes(), tmp_path / "history", any_release=True)
    assert change_lines(changes) == ["first run of fuzz valid on any vLLM release: nothing to compare with"]


@pytest.mark.parametrize("argv", [["replay", "t.jsonl"], ["fuzz"], ["selftest"], ["history"]])
def test_every_command_that_compares_runs_takes_the_one_flag(argv):
    parser = build_parser()
    assert parser.parse_args([*argv, "--across-releases"]).across_releases is True
    assert parser.parse_args(argv).across_releases is False
