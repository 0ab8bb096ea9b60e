"""A runner vLLM raised in is never reused as if clean.

vLLM is not exception-safe: a call that raises may stop half-way (block ids
staged and never applied, a request half added). The harness remembers the
first step at which vLLM raised; every later step reports it
(``StepObs.after_exception``, the ``after_exception`` column of steps.csv,
``steps_after_exception`` in summary.json), a campaign's example ends there,
and the runner pool never resets such a runner for another example.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simrig.cli import main
from simrig.runners import RunnerPool
from simrig.step import CachedUpdate, NewRequest, RunnerConfig, Step

CONFIG = RunnerConfig(max_num_reqs=4, max_num_batched_tokens=16, max_model_len=64)
STEPS = [Step(new_requests=[NewRequest("a", 4)], num_scheduled_tokens={"a": 4}),
         Step(cached=[CachedUpdate("a", 4)], num_scheduled_tokens={"a": 1, "ghost-7": 1}),
         Step(cached=[CachedUpdate("a", 5)], num_scheduled_tokens={"a": 1}),
         Step(cached=[CachedUpdate("a", 6)], num_scheduled_tokens={"a": 1})]


@pytest.mark.vllm
def test_steps_after_vllm_raised_say_so_and_the_runner_is_never_pooled(vllm_api):
    pool = RunnerPool()
    pool.prefer_reuse(CONFIG, api=vllm_api)  # a clean runner of this config would be kept
    harness = pool.acquire(CONFIG, api=vllm_api)
    seen = [harness.run_step(step) for step in STEPS]
    assert [o.after_exception for o in seen] == [None, None, 1, 1]
    assert seen[1].errors and harness.raised_at == 1
    assert not pool.release(harness)
    assert pool.stats()["tainted"] == 1 and "vLLM raised at step 1" in pool.last_dirty[0]
    clean = pool.acquire(CONFIG, api=vllm_api)
    assert clean is not harness  # rebuilt, never the tainted one
    for step in STEPS[:1]:
        assert clean.run_step(step).after_exception is None
    assert pool.release(clean) and pool.stats()["tainted"] == 1


@pytest.mark.vllm
def test_replay_reports_which_steps_ran_after_an_exception(tmp_path, capsys):
    from simrig.trace_io.trace import TraceHeader, write_trace

    trace = tmp_path / "ghost_then_decodes.jsonl"
    write_trace(trace, TraceHeader(config=CONFIG), STEPS)
    out = tmp_path / "rep"
    main(["replay", str(trace), "--stages", "gather,prepare,dummy", "--no-coverage", "--out", str(out)])
    printed = capsys.readouterr().out
    steps = pd.read_csv(out / "steps.csv", keep_default_na=False)
    marks = steps.groupby("step")["after_exception"].unique().to_dict()
    assert {k: list(v) for k, v in marks.items()} == {0: [-1], 1: [-1], 2: [1], 3: [1]}
    assert json.loads((out / "summary.json").read_text())["steps_after_exception"] == 2
    assert "2 step(s) ran on a runner vLLM had raised in" in printed
