"""Every field a stage observes is value-checked or listed as unchecked with its reason.

Drives the real vLLM through every stage (lifecycle, gather, dispatch,
prepare, postprocess, partition on every PCP and DCP rank, the dummy, the
capture dummies of a graph mode) and holds each observed (stage, field) to
``simrig.ledger.unchecked``; the oracle page's table (docs/oracle.md) is generated from that list.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from simrig.findings import findings as fk
from simrig.harness import Harness
from simrig.ledger.decisions import decisions
from simrig.ledger.unchecked import UNCHECKED, VALUE_CHECKED, lookup, readme_table
from simrig.observe import StepObs
from simrig.step import RunnerConfig
from tests.test_checks_real import BASE, CONFIGS, check_all, clean_steps, mutated, set_field

ORACLE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "oracle.md"
GRAPH = RunnerConfig(**BASE, cudagraph_mode="FULL_AND_PIECEWISE", capture_sizes=(4, 8, 16))
# LoRA on: _set_active_loras's mapping is observed (on the global batch, and on PCP rank 0's)
LORA = {"lora": RunnerConfig(**BASE, max_loras=2), "lora-pcp2": RunnerConfig(**BASE, max_loras=2, pcp_size=2)}
PP2 = RunnerConfig(**BASE, pp_size=2)  # the non-last PP rank's pipeline stage
# micro-batching: no drafts (vLLM refuses DBO with them); the drafted steps are refused as input
UBATCH = RunnerConfig(**{**BASE, "num_speculative_tokens": 0}, cudagraph_mode="FULL", capture_sizes=(4, 8, 16),
                      num_ubatches=2, dbo_decode_token_threshold=2, dbo_prefill_token_threshold=2)


@pytest.fixture(scope="module")
def observed(vllm_api) -> dict[tuple[str, str], str]:
    """(stage, field) -> the configuration that first showed it."""
    seen: dict[tuple[str, str], str] = {}
    for name, config in {**CONFIGS, "graph": GRAPH, **LORA, "pp2": PP2, "ubatch": UBATCH}.items():
        harness = Harness(config, api=vllm_api)
        for step in clean_steps():
            for stage in harness.run_step(step).stages:
                for field in stage.fields:
                    seen.setdefault((stage.stage, field), name)
    return seen


@pytest.mark.vllm
def test_every_observed_field_is_checked_or_listed(observed):
    assert {s for s, _ in observed} >= {"lifecycle", "gather", "dispatch", "prepare", "postprocess",
                                        "partition", "dummy", "capture", "profile", "pipeline"}
    neither = sorted(f"{s}.{f} (first in {cfg})" for (s, f), cfg in observed.items()
                     if lookup(VALUE_CHECKED, s, f) is None and lookup(UNCHECKED, s, f) is None)
    both = sorted(f"{s}.{f}" for (s, f) in observed
                  if lookup(VALUE_CHECKED, s, f) is not None and lookup(UNCHECKED, s, f) is not None)
    assert neither == [], "observed, but neither value-checked nor listed in simrig/ledger/unchecked.py"
    assert both == [], "both value-checked and listed as unchecked"


@pytest.mark.vllm
def test_every_observed_field_is_a_row_of_the_decisions_table(observed):
    """docs/decisions.md lists every value the probes observe, on every path."""
    rows = {(r.stage, r.field) for r in decisions()}
    assert sorted(f"{s}.{f}" for s, f in observed if (s, f) not in rows) == []


def test_every_unchecked_entry_has_a_reason_and_no_checked_twin():
    assert all(len(why) > 20 for why in UNCHECKED.values())
    assert not set(UNCHECKED) & set(VALUE_CHECKED)


def test_the_readme_table_is_generated_from_the_list():
    text = ORACLE_PAGE.read_text(encoding="utf-8")
    assert readme_table() in text, "docs/oracle.md's unchecked-fields table differs from readme_table()"
    rows = re.findall(r"^\| (?:every batch|[a-z]+) \| `[^`]+` \|", text, flags=re.MULTILINE)
    assert len(rows) == len(UNCHECKED)


# A value-checked field must make a check fail when it changes: corrupt each
# listed field of the real observations and expect a finding naming it.
CORRUPTIBLE = [
    ("prepare", "num_draft_tokens_per_req", 2), ("prepare", "num_draft_tokens", 2),
    ("prepare", "expanded_local_pos", 2), ("prepare", "prefill_runs_as_decode_np", 0),
    ("prepare", "decode_graph_eligible", 0), ("gather", "num_tokens", 1),
    ("gather", "decode_graph_eligible", 1), ("postprocess", "num_sampled", 2),
    ("postprocess", "num_rejected", 2), ("prepare", "prefill_len_np", 1),
    ("dummy", "num_tokens", 1), ("dummy", "expanded_local_pos", 1), ("dummy", "cu_num_logits", 1),
    ("lifecycle", "runner.free_slots", 1), ("lifecycle", "runner.live_ids", 1),
    ("profile", "is_padding", 0), ("profile", "num_tokens", 0), ("dummy", "is_padding", 1),
    ("dummy", "desc.num_tokens", 1), ("dummy", "cu_num_logits_np", 1),
]


def _corrupt(value):
    if isinstance(value, (bool, np.bool_)):
        return not value
    if isinstance(value, (int, np.integer)):
        return int(value) + 1
    if isinstance(value, list):  # an extra request id, or a slot listed twice
        return value + (["ghost"] if not value or isinstance(value[0], str) else [value[0]])
    out = np.asarray(value).copy()
    out[-1] = ~out[-1] if out.dtype == bool else out[-1] + 1
    return out


@pytest.mark.vllm
@pytest.mark.parametrize("stage, field, step", CORRUPTIBLE)
def test_a_checked_field_that_changes_is_a_finding(vllm_api, stage, field, step):
    config = CONFIGS["plain"]
    harness = Harness(config, api=vllm_api)
    steps = clean_steps()
    observations = [harness.run_step(s) for s in steps]
    assert lookup(VALUE_CHECKED, stage, field) is not None

    def change(o: StepObs) -> None:
        f = o.get(stage).fields[field]
        assert f.kind != "none", f"{stage}.{field} is None at step {step}"
        set_field(o, stage, field, values=_corrupt(f.values))

    found = [f for f in check_all(config, steps, mutated(observations, step, change))
             if not f.known and f.step == step and f.kind != fk.RIG_ERROR]
    assert (stage, field) in {(f.stage, f.field) for f in found}, [f.one_line() for f in found]


def _pcp_run(vllm_api, name: str):
    config = CONFIGS[name]
    harness = Harness(config, api=vllm_api)
    steps = clean_steps()
    return config, steps, [harness.run_step(s) for s in steps]


def _new(config, steps, observations, step):
    return {(f.stage, f.field, f.rank) for f in check_all(config, steps, observations)
            if not f.known and f.step == step and f.kind != fk.RIG_ERROR}


@pytest.mark.vllm
def test_every_dcp_peer_is_held_to_the_largest_shard(vllm_api):
    """pcp.dcp_local_seq_lens_cpu_upper_bound is value-checked on each DCP peer on its own
    (check_dcp_peers alone cannot fail on 0.33.0: partition_batch never reads dcp_rank)."""
    config, steps, observations = _pcp_run(vllm_api, "pcp2-dcp2")
    name = "pcp.dcp_local_seq_lens_cpu_upper_bound"
    assert _new(config, steps, observations, 0) == set()

    def change_peer(o: StepObs) -> None:  # DCP rank 1 of PCP rank 1, and only it
        peer = next(s for s in o.stages if s.stage == "partition" and s.rank == 1 and s.dcp_rank == 1)
        peer.fields[name] = dataclasses.replace(peer.fields[name], values=_corrupt(peer.fields[name].values))

    assert ("partition", name, 1) in _new(config, steps, mutated(observations, 0, change_peer), 0)


@pytest.mark.vllm
def test_is_padding_is_judged_in_the_moe_gathered_shape_too(vllm_api):
    """vLLM's default (moe_gathers_tokens, which the harness builds its managers with)
    makes a rank's is_padding the P x width mask over every rank's rows, rank-major:
    accepted when each rank's section is its own tail. The rank's own tail alone is a
    finding: the MoE all-gathers every rank's rows whenever it runs without expert-parallel
    all2all kernels (which the rig never configures), so that mask leaves the other ranks'
    rows unmarked (0.30.0-0.32.0's known MOE_NOT_GATHERED)."""
    config, steps, observations = _pcp_run(vllm_api, "pcp2")
    step = 0
    rank0 = observations[step].get("partition", 0)
    gathered = np.asarray(rank0.fields["is_padding"].values)
    width = int(rank0.fields["num_tokens_after_padding"].values)
    assert gathered.shape == (2 * width,)  # observed in vLLM's default, gathered shape

    def gather_on_rank0(values):
        def change(o: StepObs) -> None:
            f = o.get("partition", 0).fields["is_padding"]
            o.get("partition", 0).fields["is_padding"] = dataclasses.replace(
                f, values=values, shape=values.shape)
        return change

    assert ("partition", "is_padding", 0) not in _new(
        config, steps, mutated(observations, step, gather_on_rank0(gathered)), step)
    assert ("partition", "is_padding", 0) in _new(
        config, steps, mutated(observations, step, gather_on_rank0(gathered[:width].copy())), step)
    wrong = gathered.copy()
    wrong[width] = ~wrong[width]  # rank 1's first row, seen from rank 0
    assert ("partition", "is_padding", 0) in _new(
        config, steps, mutated(observations, step, gather_on_rank0(wrong)), step)
