"""Sharding plans and the one-line failures of --workers/--ray (no Ray cluster started)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simrig.campaign.fuzz import CampaignOptions
from simrig.distributed.fuzz_shards import plan_shards
from simrig.distributed.replay_shards import MIN_SEGMENT_STEPS, plan_units

REPO = Path(__file__).resolve().parents[1]


def test_shards_deal_pcp_sizes_and_seeds():
    plan = plan_shards(CampaignOptions(seed=7, pcp_sizes=(1, 2, 4), mode="valid"), 4)
    assert [s.pcp_sizes for s in plan] == [(1,), (2,), (4,), (1,)]
    assert [s.seed for s in plan] == [7, 8, 9, 10]
    assert [s.replay_regressions for s in plan] == [True, False, False, False]
    assert {s.name for s in plan} == {"s0", "s1", "s2", "s3"}
    one = plan_shards(CampaignOptions(seed=3, pcp_sizes=(1, 2)), 1)
    assert [(s.pcp_sizes, s.seed) for s in one] == [((1, 2), 3)]


def test_units_cut_long_traces_only_and_cover_every_step():
    listing = [("a", 1000, 1, False), ("b", 50, 1, False), ("c", 1000, 2, True)]
    units = plan_units(listing, workers=4)
    a = [u for u in units if u.path == "a"]
    # segment length max(200, ceil(2050 / 4)) = 513: the 1000-step trace in 2 halves
    assert MIN_SEGMENT_STEPS <= 513 and [(u.start, u.stop) for u in a] == [(0, 500), (500, 1000)]
    assert a[0].start == 0 and a[-1].stop == 1000
    assert all(x.stop == y.start for x, y in zip(a, a[1:]))
    assert [(u.start, u.stop) for u in units if u.path == "b"] == [(0, 50)]
    assert [(u.start, u.stop) for u in units if u.path == "c"] == [(0, 1000)]  # adversarial: whole
    assert [u.order for u in units] == list(range(len(units)))
    forced = plan_units([("a", 100, 1, False)], workers=1, segment_steps=30)
    assert [(u.start, u.stop) for u in forced] == [(0, 25), (25, 50), (50, 75), (75, 100)]


def _cli(args: list[str], hide_ray: bool = False) -> subprocess.CompletedProcess:
    code = ("import sys\n" + ("sys.modules['ray'] = None\n" if hide_ray else "")
            + "from simrig.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("command", [
    ["fuzz", "--workers", "2", "--budget", "5"],
    ["replay", "traces/samples", "--workers", "2"],
    ["selftest", "--workers", "2", "--mutants", "getitem-to-get"],
])
def test_missing_ray_is_one_line_exit_2_no_report(tmp_path, command):
    out = tmp_path / "out"
    done = _cli([*command, "--out", str(out)], hide_ray=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Ray is not installed" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


@pytest.mark.parametrize("address", ["127.0.0.1:1", "not-an-address"])
def test_unreachable_ray_address_is_one_line_exit_2_no_report(tmp_path, address):
    out = tmp_path / "out"
    done = _cli(["fuzz", "--workers", "2", "--ray", address, "--budget", "5", "--out", str(out)])
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "--ray" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_workers_must_be_positive(tmp_path):
    done = _cli(["fuzz", "--workers", "0", "--out", str(tmp_path / "o")])
    assert done.returncode == 2 and "--workers" in done.stderr


def test_merged_tallies_keep_true_counts_and_the_first_and_last_place():
    from simrig.distributed.merge import prefixed
    from simrig.findings.classes import ClassTally, Where, merge_tallies
    from simrig.findings.findings import Finding

    def finding(step: int, req: str) -> Finding:
        return Finding(kind="key_error", step=step, stage="gather", check="runner_errors",
                       req_ids=(req,), exception_type="KeyError")

    a, b = ClassTally(), ClassTally()
    a.add(finding(3, "r1"), Where("example-0", example=0), count=2)
    b.add(finding(1, "r2"), Where("example-0", example=0))
    b.add(finding(9, "r3"), Where("example-5", example=5))
    merged = merge_tallies([(a, prefixed("s0")), (b, prefixed("s1"))])
    (stats,) = merged.classes.values()
    assert stats.occurrences == 4
    assert (stats.first[0].trace, stats.first[1]) == ("s0/example-0", 3)
    assert (stats.last[0].trace, stats.last[1]) == ("s1/example-5", 9)
    assert stats.req_ids == ["r1", "r2", "r3"]
    assert sorted(stats.traces) == ["s0/example-0", "s1/example-0", "s1/example-5"]
    row = merged.frame().iloc[0]
    assert row.occurrences == 4 and row.first_trace == "s0/example-0"


class _Snapshot:
    """Stand-ins for Ray's handles in the lost-worker path: ``ray.get`` of the collector's
    snapshot gives the shards' last heartbeats."""

    def __init__(self, examples_done: dict[str, int]):
        from types import SimpleNamespace

        self.snapshot = SimpleNamespace(remote=lambda: {"shards": {
            name: SimpleNamespace(started_at=0.0, stats={"examples": n}) for name, n in examples_done.items()}})

    @staticmethod
    def get(value):
        return value


@pytest.mark.parametrize("done, replaced", [
    ((0, 0), [True, False]),   # two workers in a row die in their first example: given up
    ((0, 1), [True, True]),    # the second finished one: it made progress, the count starts again
    ((1, 0), [True, True]),
])
def test_a_shard_whose_workers_keep_dying_before_an_example_is_given_up(tmp_path, done, replaced):
    from ray.exceptions import WorkerCrashedError

    from simrig.distributed.fuzz_shards import MAX_FRUITLESS_CRASHES, ShardedCampaign
    from simrig.interrupt import StopRequests

    assert MAX_FRUITLESS_CRASHES == 2
    campaign = ShardedCampaign(CampaignOptions(out_dir=tmp_path, progress="quiet", max_examples=10), 1)
    campaign.crash_dir, campaign._stop = str(tmp_path), StopRequests()
    spec = plan_shards(campaign.options, 1)[0]
    got = []
    for attempt_done in done:
        ray = _Snapshot({spec.name: attempt_done})
        replacement = campaign._lost(ray, ray, spec, WorkerCrashedError())
        got.append(replacement is not None)
        if replacement is None:
            assert "given up" in campaign.notes[spec.name]
            break
        spec = replacement
    assert got == replaced


def test_a_sharded_campaign_states_the_release_its_shards_ran(tmp_path):
    """The driver loads no vLLM: the summary (and so the history row, and the run it is compared
    with) names the release and device the shards reported."""
    from simrig.campaign.options import CampaignOptions, CampaignStats
    from simrig.distributed.fuzz_shards import ShardedCampaign
    from simrig.distributed.shard import ShardResult, plan_shards
    from simrig.findings.classes import ClassTally

    options = CampaignOptions(budget_s=None, max_examples=4, database=None, out_dir=tmp_path / "out",
                              pcp_sizes=(1, 2))
    sharded = ShardedCampaign(options, workers=2)
    assert sharded.merged.summary()["vllm_version"] == ""  # no shard reported yet
    for spec in plan_shards(options, 2):
        sharded.specs[spec.name] = spec
        sharded.results[spec.name] = ShardResult(spec.name, "w", CampaignStats(), None, None, None, [],
                                                 ClassTally(), vllm_version="0.33.0", device="cpu (interp)")
    summary = sharded.merged.summary()
    assert (summary["vllm_version"], summary["device"]) == ("0.33.0", "cpu (interp)")
