"""DCP local lengths on the padded rows of a real FULL-graph step, and the capture
dummy's DCP context, judged from their meaning on hand-built observations."""

from __future__ import annotations

import numpy as np

from simrig.graph_rules.dummy_batches import check_capture_dcp_context
from simrig.graph_rules.padded_attn import check_padded_shapes
from simrig.observe import FieldObs, StageObs
from simrig.step import RunnerConfig

DCP2 = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=256, dcp_size=2,
                    cudagraph_mode="FULL", capture_sizes=(4, 8))


def _arr(values, dtype="int32") -> FieldObs:
    a = np.asarray(values, dtype=dtype)
    return FieldObs("torch", dtype, a.shape, a)


def _batch(local, stage="prepare") -> StageObs:
    return StageObs(stage=stage, fields={"num_reqs_after_padding": FieldObs("scalar", "int", (), 4),
                                         "seq_lens": _arr([9, 4, 0, 0]), "dcp_local_seq_lens": _arr(local)})


def test_padded_rows_hold_their_share_of_seq_len_zero():
    assert check_padded_shapes(0, DCP2, _batch([5, 2, 0, 0])) == []
    stale = check_padded_shapes(0, DCP2, _batch([5, 2, 3, 0]))  # a padded row left from a larger batch
    assert [f.field for f in stale] == ["dcp_local_seq_lens"]
    short = check_padded_shapes(0, DCP2, _batch([5, 2]))  # padded rows missing
    assert [f.field for f in short] == ["dcp_local_seq_lens"]


def _capture(seq_lens, mode="FULL") -> StageObs:
    return StageObs(stage="capture", fields={"desc.cg_mode": FieldObs("scalar", "str", (), mode),
                                             "num_reqs": FieldObs("scalar", "int", (), 2),
                                             "query_start_loc_np": _arr([0, 3, 6]), "seq_lens": _arr(seq_lens)})


def test_a_full_capture_under_dcp_holds_context_on_every_rank():
    assert check_capture_dcp_context(0, DCP2, _capture([5, 5])) == []
    zero = check_capture_dcp_context(0, DCP2, _capture([3, 3]))
    assert [(f.field, f.extra["pattern"]) for f in zero] == [("seq_lens", "zero_dcp_context")]
    assert [f.extra["pattern"] for f in check_capture_dcp_context(0, DCP2, _capture([4, 5]))] == ["short_dcp_context"]
    assert check_capture_dcp_context(0, DCP2, _capture([3, 3], "PIECEWISE")) == []
    no_dcp = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=256)
    assert check_capture_dcp_context(0, no_dcp, _capture([3, 3])) == []


def test_no_context_is_owed_past_max_model_len():
    """A graph promising queries of max_model_len - 1 tokens can replay only one token of context."""
    short = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=4, dcp_size=2,
                         cudagraph_mode="FULL", capture_sizes=(4, 8))
    assert check_capture_dcp_context(0, short, _capture([4, 4])) == []  # 1 token of context, all there is room for
    assert [f.extra["pattern"] for f in check_capture_dcp_context(0, short, _capture([3, 3]))] == ["zero_dcp_context"]
    full = RunnerConfig(max_num_reqs=8, max_num_batched_tokens=64, max_model_len=3, dcp_size=2,
                        cudagraph_mode="FULL", capture_sizes=(4, 8))
    assert check_capture_dcp_context(0, full, _capture([3, 3])) == []  # no room at all
