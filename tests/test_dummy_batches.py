"""Each dummy batch held to what it is for (simrig/graph_rules/dummy_batches.py), and the
profile rule proven able to fail: a seeded mutant is caught by a replay of a bundled trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simrig.graph_rules.dummy_batches import (
    check_capture_padding,
    check_dummy_dcp,
    check_idle_dummy,
    check_placeholder_fields,
    check_profile,
)
from simrig.observe import CAPTURE, DUMMY, PREPARE, PROFILE, FieldObs, StageObs
from simrig.step import RunnerConfig
from tests import mutant_cli

ROOT = Path(__file__).resolve().parents[1]
CONFIG = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256)


def _arr(values, dtype=np.int32, kind="torch") -> FieldObs:
    a = np.asarray(values, dtype=dtype)
    return FieldObs(kind, a.dtype.name, a.shape, a)


def _sc(value) -> FieldObs:
    return FieldObs("none", "", (), None) if value is None else FieldObs("scalar", "", (), value)


def _batch(stage: str, tokens: int, reqs: int, padding: bool, **extra) -> StageObs:
    q = [tokens // reqs] * reqs
    fields = {"num_tokens": _sc(tokens), "num_reqs": _sc(reqs), "num_tokens_after_padding": _sc(tokens),
              "num_reqs_after_padding": _sc(reqs), "num_scheduled_tokens": _arr(q, kind="numpy"),
              "is_padding": _arr([padding] * tokens, bool), "seq_lens": _arr(q),
              "max_query_len": _sc(None), **extra}
    return StageObs(stage=stage, fields=fields)


def _fields(found) -> list[str]:
    return [f.field for f in found]


def test_the_profile_run_marks_every_token_real():
    assert check_profile(0, CONFIG, _batch(PROFILE, 128, 8, False)) == []
    found = check_profile(0, CONFIG, _batch(PROFILE, 128, 8, True))
    assert _fields(found) == ["is_padding"] and "Profiling and warmup" in found[0].message
    mixed = _batch(PROFILE, 128, 8, False)
    mixed.fields["is_padding"] = _arr([False] * 127 + [True], bool)
    assert _fields(check_profile(0, CONFIG, mixed)) == ["is_padding"]


def test_the_profile_run_is_the_whole_budget_split_evenly():
    assert _fields(check_profile(0, CONFIG, _batch(PROFILE, 64, 8, False))) == ["num_tokens"]
    drafts = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256,
                          num_speculative_tokens=2)
    assert check_profile(0, drafts, _batch(PROFILE, 120, 8, False)) == []  # drafts' extra slots
    uneven = _batch(PROFILE, 128, 8, False)
    uneven.fields["num_scheduled_tokens"] = _arr([9] + [17] * 7, kind="numpy")
    assert _fields(check_profile(0, CONFIG, uneven)) == ["num_scheduled_tokens"]
    assert _fields(check_profile(0, CONFIG, _batch(PROFILE, 128, 16, False))) == ["num_reqs"]


def test_an_even_share_over_max_model_len_is_named_and_known_but_an_uneven_split_is_not():
    """A token budget over max_num_reqs * max_model_len (vLLM warns, and accepts it): the even
    share is over max_model_len, the known form; a request over the even share stays new."""
    from simrig.findings.known import load_known_findings

    over = RunnerConfig(max_num_reqs=2, max_num_batched_tokens=128, max_model_len=48)
    found = check_profile(0, over, _batch(PROFILE, 128, 2, False))
    assert _fields(found) == ["num_scheduled_tokens"]
    assert found[0].expected == "<= 48" and found[0].actual == "64"
    assert found[0].extra["pattern"] == "even_share_over_max_model_len"
    known = load_known_findings("0.33.0")
    assert known.judge(found[0]) is not None
    uneven = _batch(PROFILE, 128, 2, False)
    uneven.fields["num_scheduled_tokens"] = _arr([60, 68], kind="numpy")
    wrong = check_profile(0, over, uneven)
    assert _fields(wrong) == ["num_scheduled_tokens"] and "pattern" not in wrong[0].extra
    assert known.judge(wrong[0]) is None


def test_the_pcp_gathered_mask_is_read_whole():
    stage = _batch(PROFILE, 128, 8, False)
    stage.fields["is_padding"] = _arr([False] * 256, bool)  # P x width, rank-major
    assert check_profile(0, CONFIG, stage) == []
    stage.fields["is_padding"] = _arr([False] * 128 + [True] * 128, bool)
    assert _fields(check_profile(0, CONFIG, stage)) == ["is_padding"]


def test_idle_and_capture_dummies_are_all_padding():
    assert check_idle_dummy(0, 64, _batch(DUMMY, 64, 8, True)) == []
    assert _fields(check_idle_dummy(0, 64, _batch(DUMMY, 64, 8, False))) == ["is_padding"]
    assert check_capture_padding(0, _batch(CAPTURE, 16, 4, True)) == []
    assert _fields(check_capture_padding(0, _batch(CAPTURE, 16, 4, False))) == ["is_padding"]


def test_the_idle_dummy_runs_its_descriptor_which_holds_the_step():
    ok = _batch(DUMMY, 64, 8, True, **{"desc.num_tokens": _sc(64), "desc.num_reqs": _sc(None),
                                        "desc.max_query_len": _sc(None)})
    assert check_idle_dummy(0, 60, ok) == []
    assert _fields(check_idle_dummy(0, 65, ok)) == ["desc.num_tokens"]
    promised = _batch(DUMMY, 64, 8, True, **{"desc.num_tokens": _sc(64), "desc.max_query_len": _sc(8)})
    assert _fields(check_idle_dummy(0, 64, promised)) == ["max_query_len"]
    wrong_reqs = _batch(DUMMY, 64, 8, True, **{"desc.num_tokens": _sc(64), "desc.num_reqs": _sc(4)})
    assert _fields(check_idle_dummy(0, 64, wrong_reqs)) == ["desc.num_reqs"]


def test_a_dummy_s_dcp_lengths_are_each_rank_s_share():
    dcp = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=128, max_model_len=256, pcp_size=2, dcp_size=2)
    stage = _batch(DUMMY, 64, 8, True, dcp_local_seq_lens=_arr([4] * 8))
    assert check_dummy_dcp(0, dcp, stage) == []
    stage.fields["dcp_local_seq_lens"] = _arr([8] * 8)
    assert _fields(check_dummy_dcp(0, dcp, stage)) == ["dcp_local_seq_lens"]
    assert _fields(check_dummy_dcp(0, CONFIG, stage)) == ["dcp_local_seq_lens"]  # set without DCP


def test_fields_of_features_never_enabled_hold_their_off_value():
    stage = _batch(PREPARE, 8, 2, False, prompt_lens=_sc(None), has_structured_output_reqs=_sc(False))
    assert check_placeholder_fields(0, stage) == []
    stage.fields["prompt_lens"] = _arr([3, 4])
    stage.fields["has_structured_output_reqs"] = _sc(True)
    assert sorted(_fields(check_placeholder_fields(0, stage))) == ["has_structured_output_reqs", "prompt_lens"]
    dummy = _batch(DUMMY, 8, 2, True, cu_num_logits=_arr([0, 1, 2]), cu_num_logits_np=_arr([0, 1, 3], kind="numpy"))
    assert _fields(check_placeholder_fields(0, dummy)) == ["cu_num_logits_np"]


def _replay(tmp_path: Path, mutant: str) -> tuple[int, pd.DataFrame]:
    out = tmp_path / mutant.strip("-")
    proc = mutant_cli.run(["replay", "--no-coverage", str(ROOT / "traces" / "samples" / "chunked_prefill.jsonl"),
                           "--stages", "gather,dummy", "--out", str(out), "--quiet"],
                          None if mutant == "-" else mutant, timeout=400)
    assert (out / "classes.csv").is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.returncode, pd.read_csv(out / "classes.csv", keep_default_na=False)


def _profile_padding(classes: pd.DataFrame) -> pd.DataFrame:
    return classes[(classes["stage"] == "profile") & (classes["field"] == "is_padding")]


@pytest.mark.vllm
@pytest.mark.slow
def test_a_profile_run_that_marks_its_tokens_padding_is_caught(tmp_path):
    status, classes = _replay(tmp_path, "-")
    assert _profile_padding(classes).empty, classes.to_string()
    status, classes = _replay(tmp_path, "profile-tokens-padding")
    caught = _profile_padding(classes)
    assert status == 1 and len(caught) == 1, classes.to_string()
    assert caught.iloc[0]["verdict"] == "new" and caught.iloc[0]["kind"] == "value_mismatch"


def test_max_model_len_bounds_the_profile_requests_where_the_budget_fits_them():
    # (a budget over max_num_reqs * max_model_len: the known form, tested above)
    fits = RunnerConfig(max_num_reqs=2, max_num_batched_tokens=128, max_model_len=64)
    long_row = _batch(PROFILE, 128, 2, False)
    long_row.fields["num_scheduled_tokens"] = _arr([100, 28], kind="numpy")
    found = check_profile(0, fits, long_row)
    assert [(f.field, f.expected, f.actual) for f in found] == [("num_scheduled_tokens", "<= 64", "100")]
