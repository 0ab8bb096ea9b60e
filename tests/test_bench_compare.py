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

from simrig import bench
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


def test_regression_detection_follows_threshold(table) -> None:
    assert _row(table, "test_mapping[n256-get]")["status"] == bench.STATUS_REGRESSED
    assert _row(table, "test_mapping[n256-getitem]")["status"] == bench.STATUS_OK
    assert _row(table, "test_stage_latency[pcp1]")["status"] == bench.STATUS_OK
    assert _row(table, "test_numpy_fancy_index[n256-int32]")["status"] == bench.STATUS_ONLY_A
    assert _row(table, "test_numpy_fancy_index[n256-intp]")["status"] == bench.STATUS_ONLY_B
    a, b = bench.load_run(RUN_A), bench.load_run(RUN_B)
    # 1.05 regresses at 4 %, not at 5.5 % ...
    assert len(bench.regressions(bench.compare(a, b, fail_pct=4))) == 2
    assert len(bench.regressions(bench.compare(a, b, fail_pct=5.5))) == 1
    # ... and nothing is a regression without a threshold, or above 50 %.
    assert len(bench.regressions(bench.compare(a, b, fail_pct=None))) == 0
    assert len(bench.regressions(bench.compare(a, b, fail_pct=50))) == 0


def test_cli_compare_writes_markdown_csv_html(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    status = main(["bench", "--compare", "base", "2", "--storage", str(STORAGE),
                   "--out", str(out), "--fail-on-regression", "10"])
    assert status == 1  # get regressed by 50 %
    text = capsys.readouterr().out
    # the fixture runs hold no raw timings: no interval, the plain threshold decides
    assert ("| test_mapping[n256-get] | mapping n=256 | 10 us | 15 us | 1.500 | 1.250 | - "
            "| no raw timings | regressed |") in text
    csv = out / "compare_0001_base_vs_0002_change.csv"
    page = out / "compare_0001_base_vs_0002_change.html"
    assert sorted(p.name for p in out.iterdir()) == sorted([csv.name, page.name])  # no temp files left
    frame = pd.read_csv(csv)
    assert frame.loc[frame["name"] == "test_stage_latency[pcp1]", "median_ratio"].item() == pytest.approx(0.75)
    match = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page.read_text())
    assert match and base64.b64decode(match.group(1)).startswith(b"\x89PNG")


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


def _run_with_data(name: str, data: list[float]) -> pd.DataFrame:
    import numpy as np

    return pd.DataFrame([{"name": name, "fullname": name, "group": "g", "min": min(data),
                          "median": float(np.median(data)), "mean": 0.0, "stddev": 0.0,
                          "rounds": len(data), "extra_info": {}, "data": data}])


def test_raw_timings_give_an_interval_and_noise_is_not_a_regression() -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    noisy = list(1e-5 * rng.lognormal(0, 0.6, 40))  # a shared machine: 2x swings
    same_code = list(1e-5 * rng.lognormal(0, 0.6, 40))
    table = bench.compare(_run_with_data("t", noisy), _run_with_data("t", same_code), fail_pct=5)
    row = table.iloc[0]
    assert row["ci_low"] < 1 < row["ci_high"] and row["verdict"] == "within noise"
    assert row["status"] == bench.STATUS_OK  # whatever the point ratio says
    tight = list(1e-5 * rng.normal(1, 0.01, 40))
    slower = list(1.3e-5 * rng.normal(1, 0.01, 40))
    row = bench.compare(_run_with_data("t", tight), _run_with_data("t", slower), fail_pct=5).iloc[0]
    assert row["verdict"] == "slower" and row["ci_low"] > 1.2
    assert row["status"] == bench.STATUS_REGRESSED


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
