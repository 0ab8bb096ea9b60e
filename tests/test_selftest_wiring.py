"""The wiring family of the selftest stays honest: two of its mutants are found by the valid
campaign alone (no bundled trace, no database), in campaigns bounded by examples, never by
the clock; the family names every path it stands for."""

from __future__ import annotations

import pytest

from simrig.selftest.catalogue import BY_NAME, CATALOGUE, WIRING
from simrig.vllm_runtime import mutate
from simrig.vllm_runtime.mutate import Mutant

TARGETS = {m.qualname for m in WIRING}


def test_the_family_covers_each_path():
    assert len(WIRING) >= 12 and all(m in CATALOGUE for m in WIRING)
    assert not any(m.equivalent or m.control for m in WIRING)
    for path in ("GPUModelRunner.execute_model", "GPUModelRunner._dummy_run", "GPUModelRunner.profile_run",
                 "ModelCudaGraphManager.capture", "prepare_inputs_to_capture", "GPUModelRunner.prepare_attn",
                 "BlockTables.get_dummy_block_tables", "BlockTables.get_dummy_slot_mappings"):
        assert path in TARGETS, path


@pytest.mark.vllm
def test_every_wiring_mutant_applies(vllm_api):
    for mutant in WIRING:
        assert mutant.new in mutate.mutated_source(mutant), mutant.name


@pytest.mark.vllm
@pytest.mark.slow  # two mutant campaigns in child processes, ~30 s each
@pytest.mark.parametrize("name, kind, field", [
    # an existing dummy_batches rule: the idle dummy runs its descriptor's request count
    ("idle-dummy-unpadded-requests", "value_mismatch", "desc.num_reqs"),
    # the new padding rule: a dummy's slots keep what the buffer held
    ("dummy-slot-mappings-stale", "value_mismatch", "attn.slot_mappings"),
])
def test_a_wiring_mutant_is_found_by_the_valid_campaign(tmp_path, name, kind, field):
    from simrig.selftest.mutant_runs import run_child

    assert name in BY_NAME
    result = run_child(name, budget_s=0, seed=0, baseline=[], traces=[], out_dir=tmp_path,
                       timeout_s=300, max_examples=3)
    assert result.error == ""
    assert result.detected and result.via == "fuzz:valid", result
    assert (result.kind, result.signature[2]) == (kind, field)
    assert 1 <= result.examples_to_detection <= 3


class _Base:
    def who(self) -> str:
        return "base"


class _Child(_Base):
    def who(self) -> str:
        return "child of " + super().who()


def test_a_mutated_method_keeps_its_zero_argument_super():
    """capture's wiring mutants edit a method that calls super(): re-executed alone it
    would raise "__class__ cell not found", a rig artifact counted as a detection."""
    mutate.apply(Mutant("super-cell", __name__, "_Child.who", '"child of "', '"mutant of "', "test"))
    assert _Child().who() == "mutant of base"
