"""`simrig bench --compare` on real saved runs: the verdict rule errs neither way.

    A/A     the `mapping` micro benchmarks (20 items) saved 4 times per side,
            sides alternating (A, B, A, B, ...), identical code: at least 95 %
            of the rows are "within noise", none is "cannot tell"
    A/A, one save per side      every row "cannot tell"
    slower  a suite built in tmp_path where B sleeps 3x as long on one item:
            that item "slower", the unchanged one "within noise"

The saves use few, short rounds (--benchmark-max-time) so the whole module
runs in well under a minute; the noise they add is what the between-save
interval has to absorb.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from simrig.bench import suites as bench
from simrig.cli import main

REPO = Path(__file__).resolve().parents[1]
MAPPING = REPO / "tests" / "bench" / "test_micro_mapping.py"
# timing-sensitive: in the slow tier, not beside the fast suite's other worker
pytestmark = pytest.mark.slow
QUICK = ("--benchmark-max-time=0.01", "--benchmark-min-rounds=5", "--benchmark-warmup=off")
SAVES_PER_SIDE = 4


def _save(name: str, storage: Path, suite: Path) -> None:
    status, frame = bench.run_suites(filter_expr=None, save=name, storage=storage, suite=suite,
                                     extra=QUICK)
    assert status == 0 and frame is not None and len(frame), (name, status)


@pytest.fixture(scope="module")
def same_code(tmp_path_factory) -> Path:
    storage = tmp_path_factory.mktemp("aa")
    for _ in range(SAVES_PER_SIDE):
        for side in ("same-a", "same-b"):
            _save(side, storage, MAPPING)
    return storage


def _compare(storage: Path, out: Path, side_a: str, side_b: str) -> pd.DataFrame:
    assert main(["bench", "--compare", side_a, side_b, "--storage", str(storage),
                 "--out", str(out)]) == 0
    (csv,) = out.glob("*.csv")
    return pd.read_csv(csv)


def test_identical_code_is_within_noise(same_code, tmp_path, capsys) -> None:
    table = _compare(same_code, tmp_path, "same-a*", "same-b*")
    text = capsys.readouterr().out
    assert len(table) == 20 and set(table["saves_a"]) == set(table["saves_b"]) == {SAVES_PER_SIDE}
    within = int((table["verdict"] == bench.NOISE).sum())
    print(f"A/A: {within} of {len(table)} rows within noise; "
          f"median B/A {table['median_ratio'].min():.3f}..{table['median_ratio'].max():.3f}")
    assert bench.CANNOT_TELL not in set(table["verdict"])
    assert within >= 0.95 * len(table), text
    assert table["ci_low"].notna().all()


def test_one_save_per_side_cannot_tell(same_code, tmp_path, capsys) -> None:
    table = _compare(same_code, tmp_path, "same-a", "same-b")  # each name's latest save
    assert len(table) == 20 and set(table["verdict"]) == {bench.CANNOT_TELL}
    assert table["ci_low"].isna().all()
    assert "cannot tell: 20 row(s) have a single save" in capsys.readouterr().out


SLOW_SUITE = '''
import os
import time

FACTOR = float(os.environ["SIMRIG_TEST_SLOWDOWN"])


def test_unchanged(benchmark):
    benchmark(time.sleep, 0.002)


def test_changed(benchmark):
    benchmark(time.sleep, 0.002 * FACTOR)
'''


def test_a_slower_side_is_called_slower(tmp_path, monkeypatch, capsys) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_sleepy.py").write_text(SLOW_SUITE)
    storage = tmp_path / "storage"
    for _ in range(3):
        for side, factor in (("base", "1"), ("slow", "3")):
            monkeypatch.setenv("SIMRIG_TEST_SLOWDOWN", factor)
            _save(side, storage, suite)
    table = _compare(storage, tmp_path / "out", "base*", "slow*").set_index("name")
    print(table[["median_ratio", "ci_low", "ci_high", "verdict"]])
    changed, unchanged = table.loc["test_changed"], table.loc["test_unchanged"]
    assert changed["verdict"] == bench.SLOWER and changed["ci_low"] > 1.05
    assert 2 < changed["median_ratio"] < 4
    assert unchanged["verdict"] == bench.NOISE
