"""`simrig bench --compare`: ratio math, regression detection and outputs on two
hand-made saved runs (tests/fixtures/bench).

Fixture numbers (seconds), A = 0001_base, B = 0002_change:

    benchmark                        min A   min B   median A  median B
    test_mapping[n256-get]           8e-6    1e-5    1e-5      1.5e-5    -> min 1.25, median 1.5
    test_mapping[n256-getitem]       6e-6    6e-6    8e-6      8.4e-6    -> min 1.0,  median 1.05
    test_stage_latency[pcp1]         0.5     0.4     0.6       0.45      -> min 0.8,  median 0.75
    test_numpy_fancy_index[..int32]  only in A
    test_numpy_fancy_index[..intp]   only in B
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from simrig.bench import suites as bench
from simrig.cli import main
from simrig.errors import UsageError

STORAGE = Path(__file__).parent / "fixtures" / "bench"
RUN_A = STORAGE / "Linux-CPython-3.11-64bit" / "0001_base.json"
RUN_B = STORAGE / "Linux-CPython-3.11-64bit" / "0002_change.json"


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return bench.compare(bench.load_run(RUN_A), bench.load_run(RUN_B), fail_pct=10)


def _row(table: pd.DataFrame, name: str) -> pd.Series:
    rows = table[table["name"] == name]
    assert len(rows) == 1, name
    return rows.iloc[0]


def test_load_run_one_row_per_benchmark() -> None:
    run = bench.load_run(RUN_A)
    assert list(run.columns) == list(bench.RUN_COLUMNS)
    assert len(run) == 4
    get = run[run["name"] == "test_mapping[n256-get]"].iloc[0]
    assert (get["group"], get["min"], get["median"], get["rounds"]) == ("mapping n=256", 8e-6, 1e-5, 1000)
    assert get["extra_info"] == {"n": 256, "method": "get", "dtype": "int64"}


def test_ratios_match_hand_computed(table) -> None:
    expected = {  # name: (min B/A, median B/A)
        "test_mapping[n256-get]": (1.25, 1.5),
        "test_mapping[n256-getitem]": (1.0, 1.05),
        "test_stage_latency[pcp1]": (0.8, 0.75),
    }
    for name, (min_ratio, median_ratio) in expected.items():
        row = _row(table, name)
        assert row["min_ratio"] == pytest.approx(min_ratio, rel=1e-12), name
        assert row["median_ratio"] == pytest.approx(median_ratio, rel=1e-12), name
    # worst median ratio first, unmatched rows last
    assert list(table["name"][:3]) == list(expected)


def test_one_save_per_side_cannot_tell_but_the_limit_still_gates(table) -> None:
    """One save per side: no verdict and no interval, however large the ratio;
    a ratio over --fail-on-regression is "over limit, cannot tell" (exit 1)."""
    assert set(table["verdict"].iloc[:3]) == {bench.CANNOT_TELL}
    assert table["ci_low"].iloc[:3].isna().all()
    assert _row(table, "test_mapping[n256-get]")["status"] == bench.STATUS_UNVERIFIED
    assert _row(table, "test_mapping[n256-getitem]")["status"] == bench.STATUS_OK
    assert _row(table, "test_stage_latency[pcp1]")["status"] == bench.STATUS_OK
    assert _row(table, "test_numpy_fancy_index[n256-int32]")["status"] == bench.STATUS_ONLY_A
    assert _row(table, "test_numpy_fancy_index[n256-intp]")["status"] == bench.STATUS_ONLY_B
    a, b = bench.load_run(RUN_A), bench.load_run(RUN_B)
    # 1.05 is over the limit at 4 %, not at 5.5 % ...
    assert len(bench.unverified(bench.compare(a, b, fail_pct=4))) == 2
    assert len(bench.unverified(bench.compare(a, b, fail_pct=5.5))) == 1
    # ... nothing is without a threshold, or above 50 %; never "regressed" on one save.
    assert len(bench.unverified(bench.compare(a, b, fail_pct=None))) == 0
    assert len(bench.unverified(bench.compare(a, b, fail_pct=50))) == 0
    assert len(bench.regressions(bench.compare(a, b, fail_pct=4))) == 0


def test_cli_compare_writes_markdown_csv_html(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    status = main(["bench", "--compare", "base", "2", "--storage", str(STORAGE),
                   "--out", str(out), "--fail-on-regression", "10"])
    assert status == 1  # get is 50 % over, and one save per side cannot rule out noise
    text = capsys.readouterr().out
    assert ("| test_mapping[n256-get] | mapping n=256 | 1/1 | 10 us | 15 us | 1.500 | 1.250 | - "
            "| cannot tell | over limit, cannot tell |") in text
    assert "A (1 save): " in text and "cannot tell: 3 row(s) have a single save" in text
    assert "--interleave" in text  # the way to a verdict that matters
    csv = out / "compare_0001_base_vs_0002_change.csv"
    page = out / "compare_0001_base_vs_0002_change.html"
    assert sorted(p.name for p in out.iterdir()) == sorted([csv.name, page.name])  # no temp files left
    frame = pd.read_csv(csv)
    assert frame.loc[frame["name"] == "test_stage_latency[pcp1]", "median_ratio"].item() == pytest.approx(0.75)
    assert set(frame["verdict"].dropna()) == {"cannot tell", "-"}
    html = page.read_text()
    match = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert match and base64.b64decode(match.group(1)).startswith(b"\x89PNG")
    assert "cannot tell" in html and "--interleave" in html


def test_cli_compare_passes_under_loose_threshold(tmp_path, capsys) -> None:
    assert main(["bench", "--compare", str(RUN_A), str(RUN_B), "--out", str(tmp_path),
                 "--fail-on-regression", "60"]) == 0


@pytest.mark.parametrize("content, problem", [
    ('{"benchmarks": [', ":1: JSON: "),
    ('{"machine_info": {}}', ": benchmarks: missing"),
    ('{"benchmarks": []}', ": benchmarks: empty"),
    ('{"benchmarks": [{"name": "x", "stats": {"min": 1, "mean": 1, "stddev": 0, "rounds": 1}}]}',
     ": benchmarks[0].stats.median: missing"),
])
def test_malformed_run_is_one_line_exit_2(tmp_path, capsys, content, problem) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "out"
    assert main(["bench", "--compare", str(bad), str(RUN_B), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and problem in err and str(bad) in err
    assert not out.exists()  # no half-written output


def test_missing_run_is_exit_2(tmp_path, capsys) -> None:
    assert main(["bench", "--compare", "base", "no-such-run", "--storage", str(STORAGE),
                 "--out", str(tmp_path)]) == 2
    assert "run 'no-such-run'" in capsys.readouterr().err


def test_resolve_run_by_path_name_number_and_stem() -> None:
    assert bench.resolve_run(str(RUN_A), STORAGE) == RUN_A
    assert bench.resolve_run("change", STORAGE) == RUN_B
    assert bench.resolve_run("1", STORAGE) == RUN_A
    assert bench.resolve_run("0002_change", STORAGE) == RUN_B
    with pytest.raises(UsageError):
        bench.resolve_run("3", STORAGE)


def test_pytest_command_overrides_default_ignore(tmp_path) -> None:
    cmd = bench.pytest_command(filter_expr="n8", save="base", storage=tmp_path)
    assert cmd[cmd.index("-o") + 1] == "addopts="
    assert "--benchmark-enable" in cmd and "--benchmark-save=base" in cmd
    assert cmd[cmd.index("-k") + 1] == "n8"
    json.dumps(cmd)  # plain strings only


def test_extra_info_table_lists_stage_medians() -> None:
    text = bench.extra_markdown(bench.load_run(RUN_B))
    assert text.splitlines()[0] == "| benchmark | prepare_median_ms |"
    assert "| test_stage_latency[pcp1] | 40 |" in text
    assert "| test_mapping[n256-get] |" not in text  # no stage data: no row


def _save(medians: dict[str, float], path: str = "") -> pd.DataFrame:
    """One saved run as load_run returns it, with these medians (seconds)."""
    frame = pd.DataFrame([{"name": k, "fullname": k, "group": "g", "min": v * 0.9, "median": v,
                           "mean": v, "stddev": 0.0, "rounds": 10, "extra_info": {}, "data": []}
                          for k, v in medians.items()])
    frame.attrs["path"] = path
    return frame


def test_within_run_precision_alone_gives_no_verdict() -> None:
    """The reported bug: two saves of identical code, 1.82x apart, each with
    thousands of tight rounds. Rounds inside a run share its load: no verdict."""
    tight = [1e-5 * (1 + 1e-4 * i) for i in range(2000)]
    a = _save({"t": 1e-5}).assign(data=[tight])
    b = _save({"t": 1.82e-5}).assign(data=[[x * 1.82 for x in tight]])
    row = bench.compare(a, b).iloc[0]
    assert row["median_ratio"] == pytest.approx(1.82)
    assert row["verdict"] == bench.CANNOT_TELL and pd.isna(row["ci_low"])


def test_between_save_spread_sets_the_verdict() -> None:
    """Three saves per side; per-save medians spread by 0.2 % (one row: 4x)."""
    jitter = (1.0, 1.002, 0.998)
    a = [_save({"same": 1e-5 * j, "slow": 1e-5 * j, "fast": 1e-5 * j, "small": 1e-5 * j,
                "noisy": 1e-5 * j}) for j in jitter]
    b = [_save({"same": 1e-5 * j, "slow": 1.3e-5 * j, "fast": 0.7e-5 * j, "small": 1.03e-5 * j,
                "noisy": 1.3e-5 * n})
         for j, n in zip(jitter[::-1], (0.5, 1.0, 2.0))]
    table = bench.compare(a, b, fail_pct=10).set_index("fullname")
    assert table.attrs["judged"] == 5 and table.attrs["level"] == pytest.approx(1 - 0.05 / 5)
    assert list(table["saves_a"]) == [3] * 5 and list(table["saves_b"]) == [3] * 5
    assert table.loc["same", "verdict"] == bench.NOISE
    assert 0.98 < table.loc["same", "ci_low"] < 1 < table.loc["same", "ci_high"] < 1.02
    assert table.loc["slow", "verdict"] == bench.SLOWER and table.loc["slow", "ci_low"] > 1.05
    assert table.loc["slow", "median_ratio"] == pytest.approx(1.3)
    assert table.loc["slow", "status"] == bench.STATUS_REGRESSED
    assert table.loc["fast", "verdict"] == bench.FASTER and table.loc["fast", "ci_high"] < 1 / 1.05
    # 3 % slower, interval clear of 1 but not of the 5 % minimum effect: within noise ...
    assert 1 < table.loc["small", "ci_low"] < 1.05
    assert table.loc["small", "verdict"] == bench.NOISE
    # ... and with no minimum effect the same data says slower.
    relaxed = bench.compare(a, b, min_effect=0.0).set_index("fullname")
    assert relaxed.loc["small", "verdict"] == bench.SLOWER
    # 30 % slower at the point, but B's saves swing 4x: within noise, not a regression.
    assert table.loc["noisy", "median_ratio"] > 1.1 and table.loc["noisy", "verdict"] == bench.NOISE
    assert table.loc["noisy", "status"] == bench.STATUS_OK


def test_a_benchmark_missing_from_some_saves() -> None:
    a = [_save({"x": 1e-5, "y": 1e-5}), _save({"x": 1.01e-5})]
    b = [_save({"x": 1e-5, "y": 1e-5}), _save({"x": 1e-5, "y": 1.01e-5})]
    table = bench.compare(a, b).set_index("fullname")
    assert (table.loc["x", "saves_a"], table.loc["y", "saves_a"]) == (2, 1)
    assert table.loc["x", "verdict"] == bench.NOISE
    assert table.loc["y", "verdict"] == bench.CANNOT_TELL  # one save of y on side A
    assert table.attrs["judged"] == 1


def test_t_quantile_matches_the_tables() -> None:
    from simrig.bench.saves import t_quantile

    for level, df, table_value in [(0.95, 1, 12.706), (0.95, 2, 4.303), (0.95, 4, 2.776),
                                   (0.99, 5, 4.032), (0.95, 10, 2.228), (0.95, 30, 2.042),
                                   (0.998, 8, 4.501)]:
        assert t_quantile(level, df) == pytest.approx(table_value, abs=1e-3), (level, df)


def _write_save(storage: Path, number: int, name: str, medians: dict[str, float]) -> Path:
    path = storage / "Linux-CPython-3.11-64bit" / f"{number:04d}_{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmarks": [
        {"name": k, "fullname": k, "group": "g", "extra_info": {},
         "stats": {"min": v, "median": v, "mean": v, "stddev": 0.0, "rounds": 5}}
        for k, v in medians.items()]}))
    return path


def test_resolve_side_lists_and_patterns(tmp_path) -> None:
    saves = [_write_save(tmp_path, i, name, {"t": 1.0})
             for i, name in enumerate(["base", "change", "base", "change", "base"], start=1)]
    assert bench.resolve_side("base", tmp_path) == [saves[4]]  # a name: its latest save
    assert bench.resolve_side("base*", tmp_path) == [saves[0], saves[2], saves[4]]
    assert bench.resolve_side("1,3,0005_base", tmp_path) == [saves[0], saves[2], saves[4]]
    assert bench.resolve_side("000[24]_*,change", tmp_path) == [saves[1], saves[3]]  # no duplicates
    assert bench.saves_named(saves[4], tmp_path) == 3
    with pytest.raises(UsageError, match="matches no saved run"):
        bench.resolve_side("nope*", tmp_path)
    with pytest.raises(UsageError, match="empty run name"):
        bench.resolve_side("base,", tmp_path)


def test_cli_compare_sets_of_saves(tmp_path, capsys) -> None:
    """--compare 'base*' 'change*': verdicts from the saves; slower beyond the
    limit exits 1, and a large but noisy ratio does not."""
    for i, j in enumerate((1.0, 1.02, 0.98)):
        _write_save(tmp_path, 2 * i + 1, "base", {"steady": 1e-5 * j, "slow": 1e-5 * j,
                                                  "noisy": 1e-5 * j})
        _write_save(tmp_path, 2 * i + 2, "change", {"steady": 1e-5 * j, "slow": 2e-5 * j,
                                                    "noisy": 1.5e-5 * (0.4, 1.0, 2.5)[i]})
    out = tmp_path / "out"
    args = ["bench", "--compare", "base*", "change*", "--storage", str(tmp_path), "--out", str(out)]
    assert main(args + ["--fail-on-regression", "10"]) == 1
    text = capsys.readouterr().out
    assert "A (3 saves): " in text and "B (3 saves): " in text
    assert re.search(r"\| slow \| g \| 3/3 \| 10 us \| 20 us \| 2\.000 \| .* \| slower \| regressed \|", text)
    # 50 % over the limit at the point, but B's saves swing 6x: within noise, not a regression.
    assert re.search(r"\| noisy \| g \| 3/3 \| 10 us \| 15 us \| 1\.500 \| .* \| within noise \| ok \|",
                     text)
    assert "verdicts: 1 slower, 2 within noise." in text
    assert "1 benchmark(s) slower beyond 10%: worst slow median x2.000" in text
    frame = pd.read_csv(out / "compare_0001_base+2_vs_0002_change+2.csv").set_index("fullname")
    assert frame.loc["slow", "verdict"] == "slower" and frame.loc["slow", "ci_low"] > 1.05
    assert frame.loc["steady", "verdict"] == "within noise"
    # A name alone is its latest save: one per side, cannot tell, and a hint.
    assert main(["bench", "--compare", "base", "change", "--storage", str(tmp_path),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "'base*' compares them all" in text and "verdicts: 3 cannot tell." in text


def test_min_effect_needs_compare(capsys) -> None:
    assert main(["bench", "--min-effect", "3"]) == 2
    assert "--min-effect: needs --compare" in capsys.readouterr().err


def test_interleaved_rounds_pair_the_load() -> None:
    """Round k of A and B ran in the same window: a load swing shared by both
    is not a change, a consistent 30 % is."""
    def frame(values: dict[str, float]) -> pd.DataFrame:
        return pd.DataFrame([{"fullname": k, "median": v} for k, v in values.items()])

    load = [1.0, 2.0, 1.0, 1.9, 1.2]
    a = [frame({"same": x, "slow": x}) for x in load]
    b = [frame({"same": x * (1.01 if i % 2 else 0.99), "slow": x * 1.3}) for i, x in enumerate(load)]
    table = bench.interleaved_table(a, b).set_index("fullname")
    assert table.loc["same", "verdict"] == "within noise"
    assert table.loc["slow", "verdict"] == "slower"
    assert abs(table.loc["slow", "median_ratio"] - 1.3) < 1e-9
