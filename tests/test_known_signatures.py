"""Known findings match on a precise signature: a different bug in the same field is new.

Unit tests on the matcher (no vLLM), then the committed baseline against real
observations of the installed vLLM corrupted in a *different* way than the
documented finding.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from simrig.checks.checker import Checker
from simrig.errors import UsageError
from simrig.findings import findings as fk
from simrig.findings.known import load_known_findings, parse_known_findings
from simrig.harness import Harness
from simrig.observe import StepObs
from simrig.step import RunnerConfig
from tests.test_checks_real import BASE, check_all, clean_steps, mutated, set_field


def _table(**entry):
    base = {"kind": fk.DTYPE_DRIFT, "stage": "dummy", "field": "logits_indices", "check": "parity",
            "explanation": "why", "vllm": ">=0.30.0"}
    return parse_known_findings(json.dumps({"findings": [{**base, **entry}]}), "k.json").for_version("0.33.0")


def _finding(**kw):
    base = dict(kind=fk.DTYPE_DRIFT, step=0, stage="dummy", check="parity", field="logits_indices",
                expected="torch int64", actual="torch int32")
    return fk.Finding(**{**base, **kw})


def test_a_dtype_entry_explains_only_its_own_drift():
    table = _table(expected="torch int64", actual="torch int32")
    assert table.apply([_finding()])[0].known
    assert not table.apply([_finding(actual="torch int16")])[0].known
    assert not table.apply([_finding(expected="torch int32", actual="torch int64")])[0].known


def test_a_pattern_entry_explains_only_that_value_pattern():
    table = _table(kind=fk.VALUE_MISMATCH, field="positions", check="semantics", pattern="all_zero")
    zero = _finding(kind=fk.VALUE_MISMATCH, field="positions", check="semantics")
    zero.extra["pattern"] = "all_zero"
    other = _finding(kind=fk.VALUE_MISMATCH, field="positions", check="semantics")
    other.extra["pattern"] = "other"
    assert table.apply([zero])[0].known
    assert not table.apply([other])[0].known


def test_a_when_entry_holds_only_for_its_configurations():
    table = _table(kind=fk.MISSING_FIELD, stage="gather", field="prefill_runs_as_decode_np",
                   check="contract", when={"pcp_size": ">=2"})
    f = lambda: _finding(kind=fk.MISSING_FIELD, stage="gather", field="prefill_runs_as_decode_np",
                         check="contract")
    assert table.apply([f()], {"pcp_size": 2})[0].known
    assert not table.apply([f()], {"pcp_size": 1})[0].known
    assert not table.apply([f()])[0].known  # no configuration given: the condition is not met


@pytest.mark.parametrize("entry, where", [
    ({"actual": 32}, r"findings\[0\]\.actual"),
    ({"when": {"pcp_size": "two"}}, r"findings\[0\]\.when\.pcp_size"),
    ({"when": {"colour": ">=2"}}, r"findings\[0\]\.when\.colour"),
    ({"when": [">=2"]}, r"findings\[0\]\.when"),
])
def test_a_malformed_signature_names_the_entry_and_field(entry, where):
    with pytest.raises(UsageError, match=r"k\.json:1: " + where):
        _table(**entry)


def test_every_committed_entry_has_a_precise_signature():
    """No entry of the baseline may accept any value of its field."""
    for version in ("0.30.0", "0.31.0", "0.32.0", "0.33.0"):
        for e in load_known_findings(version).entries:
            assert e.actual is not None or e.pattern is not None, e.source


# ------------------------------------------------ the baseline on real observations
@pytest.fixture(scope="module")
def plain(vllm_api):
    config = RunnerConfig(**BASE)
    harness = Harness(config, api=vllm_api)
    steps = clean_steps()
    return config, steps, [harness.run_step(s) for s in steps]


@pytest.mark.vllm
def test_dummy_positions_wrong_in_another_way_are_new(plain):
    """The documented bug zero-fills the dummy's positions; positions counted
    batch-wide (0..num_tokens-1, never restarting per row) are a different bug."""
    config, steps, observations = plain
    step = next(i for i, o in enumerate(observations)
                if len(o.get("dummy").fields["positions"].values) > 1)

    def batch_wide(o: StepObs) -> None:
        n = len(o.get("dummy").fields["positions"].values)
        set_field(o, "dummy", "positions", values=np.arange(1, n + 1, dtype=np.int64))

    findings = [f for f in check_all(config, steps, mutated(observations, step, batch_wide))
                if f.field == "positions" and f.stage == "dummy"]
    assert findings and not any(f.known for f in findings if f.step == step)
    assert findings[0].extra["pattern"] == "other"
    # the documented zero fill on the same step stays known
    zero = [f for f in check_all(config, steps, observations) if f.field == "positions" and f.stage == "dummy"]
    assert zero and all(f.known and f.extra["pattern"] == "all_zero" for f in zero)


@pytest.mark.vllm
def test_dummy_logits_indices_in_another_dtype_is_new(plain):
    config, steps, observations = plain

    def int16(o: StepObs) -> None:
        f = o.get("dummy").fields["logits_indices"]
        set_field(o, "dummy", "logits_indices", dtype="int16", values=f.values.astype(np.int16))

    found = [f for f in check_all(config, steps, mutated(observations, 1, int16))
             if f.field == "logits_indices" and f.stage == "dummy" and f.step == 1]
    assert {(f.check, f.actual, f.known) for f in found if f.check in ("contract", "parity")} == {
        ("contract", "torch int16", False), ("parity", "torch int16", False)}


@pytest.mark.vllm
def test_the_pcp_only_entry_does_not_cover_a_plain_regression(plain):
    """gather's prefill_runs_as_decode_np is None under PCP by design (known);
    None without PCP, where the field is due, is a regression and new."""
    config, steps, observations = plain
    step = next(i for i, o in enumerate(observations)
                if o.get("gather").fields["prefill_runs_as_decode_np"].kind != "none")

    def drop(o: StepObs) -> None:
        set_field(o, "gather", "prefill_runs_as_decode_np", kind="none", dtype="", values=None, shape=())

    checker = Checker(config, trace="t")
    found = [f for i, (s, o) in enumerate(zip(steps, mutated(observations, step, drop)))
             for f in checker.check(i, s, o) if f.field == "prefill_runs_as_decode_np" and f.stage == "gather"]
    assert found and not any(f.known for f in found)


def test_a_window_1_group_keeping_its_below_window_entries_is_known_and_only_that():
    """The shrunk campaign trace (exactly as the shrinker wrote it): a sliding-window
    group of window 1 whose entries below the window 0.33.0 does not null."""
    from pathlib import Path

    from simrig.replay import replay_trace

    trace = Path(__file__).resolve().parent / "fixtures" / "sliding_window_1_kept.jsonl"
    result = replay_trace(trace)
    rows = result.findings[result.findings["field"].str.startswith("attn.block_tables")]
    assert len(rows) and set(rows["verdict"]) == {"known"}
    table = load_known_findings("0.33.0")
    def rows(extra):
        return [fk.Finding(kind=fk.VALUE_MISMATCH, step=1, stage="prepare", check="blocks",
                           field="attn.block_tables.1", extra=extra)]

    kept = {"pattern": "below_window_kept:window=1"}
    assert table.apply(rows(kept))[0].known
    for other in ({"pattern": "below_window_kept:window=2"}, {}):  # another window, another form: new
        assert not table.apply(rows(other))[0].known
    # 0.30.0-0.32.0 null no entry below the window (fixed in 0.33.0): kept at any window is
    # their known finding, any other form new; on 0.34.0 nothing is known yet
    for release in ("0.30.0", "0.32.0"):
        older = load_known_findings(release)
        assert all(older.apply(rows(k))[0].known for k in (kept, {"pattern": "below_window_kept:window=2"}))
        assert not older.apply(rows({}))[0].known
        assert not older.apply(rows({"pattern": "below_window"}))[0].known
    assert not load_known_findings("0.34.0").apply(rows(kept))[0].known


@pytest.mark.vllm
def test_rows_a_larger_batch_left_are_seen_and_judged_by_release():
    """Two shrunk campaign traces (exactly as the shrinker wrote them), each a larger batch then
    a smaller one with no idle dummy between. Without PCP (a 0.32.0 campaign's trace) the
    installed release clears the rows the larger batch left (0.33.0's fix): no rows-past
    finding. Under PCP (a 0.33.0 campaign's) the rank-local tables keep them: known (#46), and
    only the pattern the entry names is known."""
    from pathlib import Path

    from simrig.replay import replay_trace

    fixtures = Path(__file__).resolve().parent / "fixtures"
    plain = replay_trace(fixtures / "stale_rows_after_larger_batch.jsonl").findings
    assert not plain["field"].str.startswith("attn.filled_rows_past").any()
    pcp = replay_trace(fixtures / "pcp_local_stale_rows.jsonl").findings
    past = pcp[pcp["field"] == "attn.filled_rows_past.0"]
    assert set(past["stage"]) >= {"partition"} and set(past["verdict"]) == {"known"}
    assert set(past["actual"]) == {"[1]"}  # the prefill's second rank-local row, left by step 0
    table = load_known_findings("0.33.0")
    finding = lambda extra: [fk.Finding(kind=fk.VALUE_MISMATCH, step=1, stage="partition", check="blocks",
                                        field="attn.filled_rows_past.0", extra=extra)]
    assert table.apply(finding({"pattern": "rows_past_filled"}))[0].known
    assert not table.apply(finding({}))[0].known
    # without PCP the rows-past form is known only before 0.33.0
    prepare = lambda: [fk.Finding(kind=fk.VALUE_MISMATCH, step=1, stage="prepare", check="blocks",
                                  field="attn.filled_rows_past.0", extra={"pattern": "rows_past_filled"})]
    assert load_known_findings("0.32.0").apply(prepare())[0].known
    assert not table.apply(prepare())[0].known
