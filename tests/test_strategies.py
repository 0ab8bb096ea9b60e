"""Strategies: arguments are validated, and generated steps obey the scheduler contract."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from simrig.checks.lifecycle import SchedulerContract
from simrig.step import RunnerConfig, block_groups
from strategies import (
    CudagraphDescriptor,
    cudagraph_descriptors,
    new_requests,
    prompt_lengths,
    runner_configs,
    scheduled_runs,
    scheduler_step,
    scheduler_steps,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def _independent_contract(config: RunnerConfig, steps) -> None:
    """The contract written out once more, independently of strategies.model."""
    computed: dict[str, int] = {}
    prefill: dict[str, int] = {}
    for step in steps:
        for r in (*step.finished, *step.preempted):
            computed.pop(r)
        fresh = [r for r in step.new_requests if not r.streaming]
        assert len(computed) + len(fresh) <= config.max_num_reqs
        for req in step.new_requests:
            if req.streaming:  # a held request's next input: from at most what the runner computed
                assert req.req_id in computed and req.num_computed_tokens <= computed[req.req_id]
            else:
                assert req.req_id not in computed
            assert 0 <= req.num_computed_tokens < req.num_prefill_tokens <= config.max_model_len
            computed[req.req_id], prefill[req.req_id] = req.num_computed_tokens, req.num_prefill_tokens
        for upd in step.cached:
            assert upd.num_computed_tokens == computed[upd.req_id]
        assert 0 < step.total_num_scheduled_tokens <= config.max_num_batched_tokens
        assert len(step.num_scheduled_tokens) <= config.max_num_reqs
        for req_id, n in step.num_scheduled_tokens.items():
            k = step.spec_tokens.get(req_id, 0)
            nc = computed[req_id]
            assert nc + n <= config.max_model_len
            if k:
                if nc < prefill[req_id]:  # placeholder drafts (P/D): one prompt token left, all rejected
                    assert nc == prefill[req_id] - 1 and step.rejected.get(req_id, 0) == k, \
                        "drafts only past prefill, or placeholders over the last prompt token"
                assert n == 1 + k and k <= config.num_speculative_tokens
            if nc >= prefill[req_id]:
                assert n == 1 + k, "a decode row is 1 + drafts"
            computed[req_id] = nc + n - step.rejected.get(req_id, 0)


@FAST
@given(scheduled_runs(max_steps=12))
def test_generated_steps_obey_the_contract(run):
    config, steps = run
    assert steps
    _independent_contract(config, steps)
    contract = SchedulerContract(config)  # the Checker's own rules agree
    for step in steps:
        assert contract.violations(step) == []


@FAST
@given(scheduled_runs(config=runner_configs(multi_kv_groups=st.booleans()), max_steps=6))
def test_every_request_sent_as_new_carries_blocks_for_its_tokens(run):
    config, steps = run
    for step in steps:
        for req in step.new_requests:
            needed = req.num_computed_tokens + step.num_scheduled_tokens[req.req_id]
            for g, blocks in enumerate(block_groups(req.block_ids, config.num_kv_groups)):
                span = config.group_block_size(g) * config.dcp_size  # one scheduler block under DCP
                group = config.kv_groups[g]
                # a sliding-window group's blocks wholly below the hit's window are null
                skipped = (max(0, req.num_computed_tokens - group.window + 1) // span
                           if group.kind == "sliding_window" else 0)
                assert len(blocks) == -(-needed // span)
                assert blocks[:skipped] == [0] * skipped and 0 not in blocks[skipped:]


@FAST
@given(st.data())
def test_runner_configs_respect_arguments(data):
    config = data.draw(runner_configs(pcp_sizes=st.sampled_from((2, 4)), max_num_reqs=st.integers(1, 3)))
    config.validate()
    assert config.pcp_size in (2, 4) and 1 <= config.max_num_reqs <= 3
    assert config.max_num_batched_tokens >= config.max_num_reqs


@FAST
@given(st.integers(1, 64), st.integers(1, 64), st.data())
def test_cudagraph_descriptors_never_pad_below_the_batch(tokens, reqs, data):
    reqs = min(reqs, tokens)
    desc = data.draw(cudagraph_descriptors(tokens, reqs))
    assert isinstance(desc, CudagraphDescriptor) and desc.num_tokens >= tokens
    if desc.mode == "FULL":
        assert reqs <= desc.num_reqs <= desc.num_tokens
    else:
        assert desc.num_reqs is None
    assert desc.mode != "NONE" or desc.num_tokens == tokens


def test_strategies_reach_resume_spec_rejection_and_prefix_hits():
    """Each hard-to-reach contract feature is generated at all (deterministic run)."""
    cfg = runner_configs(num_speculative_tokens=st.just(2), pcp_sizes=st.just(1))
    seen = {"resume": 0, "rejected": 0, "prefix_hit": 0, "preempted": 0, "chunked": 0, "streaming": 0}

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(scheduled_runs(config=cfg, max_steps=12))
    def probe(run):
        for s in run[1]:
            seen["resume"] += any((q.prefill_len or 0) > q.prompt_len for q in s.new_requests)
            seen["rejected"] += bool(s.rejected)
            seen["prefix_hit"] += any(q.num_computed_tokens > 0 for q in s.new_requests)
            seen["preempted"] += bool(s.preempted)
            seen["streaming"] += any(q.streaming for q in s.new_requests)
            seen["chunked"] += any(s.num_scheduled_tokens[q.req_id] < q.num_prefill_tokens
                                   - q.num_computed_tokens for q in s.new_requests)

    probe()
    assert all(seen.values()), seen


@FAST
@given(scheduler_step(config=runner_configs(max_num_reqs=st.just(2))))
def test_a_single_step_only_sends_new_requests(step):
    assert step.new_requests and not step.cached
    assert set(step.num_scheduled_tokens) == {r.req_id for r in step.new_requests}


@FAST
@given(new_requests(max_model_len=40, block_size=8))
def test_new_requests_fit_the_context(req):
    assert 1 <= req.prompt_len <= 40 and req.num_computed_tokens % 8 == 0
    assert req.num_computed_tokens < req.prompt_len


@pytest.mark.parametrize("build, message", [
    (lambda: scheduler_steps(config=RunnerConfig()), "must be a SearchStrategy"),
    (lambda: scheduler_steps(min_steps=-1), "min_steps=-1"),
    (lambda: scheduler_steps(min_steps=5, max_steps=2), "max_steps=2"),
    (lambda: runner_configs(pcp_sizes=2), "pcp_sizes=2"),
    (lambda: prompt_lengths(max_model_len=0), "max_model_len=0"),
    (lambda: new_requests(prefix_caching="yes"), "prefix_caching"),
    (lambda: cudagraph_descriptors(4, 8), "num_reqs=8"),
    (lambda: cudagraph_descriptors(4, 2, modes=("EAGER",)), "modes='EAGER'"),
])
def test_bad_arguments_raise_invalid_argument(build, message):
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")):
        build()


# ------------------------------------------------- lifecycle corners are reachable
def _corners(steps) -> set[str]:
    """The lifecycle corners a run of steps exercises, read off the steps alone."""
    computed: dict[str, int] = {}
    prefill: dict[str, int] = {}
    last_step: dict[str, int] = {}
    drafted: set[str] = set()
    seen: set[str] = set()
    for k, step in enumerate(steps):
        for r in step.preempted:
            if r in computed and computed[r] < prefill[r]:
                seen.add("preempt_mid_prefill")
            if r in drafted:
                seen.add("preempt_mid_spec")
        for r in step.finished:
            if last_step.get(r) == k - 1 and computed.get(r, 0) < prefill.get(r, 0):
                seen.add("abort_right_after_schedule")
        for r in (*step.finished, *step.preempted):
            computed.pop(r, None)
        for req in step.new_requests:
            if req.num_prefill_tokens > req.prompt_len:
                seen.add("resume_with_outputs")
            computed[req.req_id], prefill[req.req_id] = req.num_computed_tokens, req.num_prefill_tokens
        drafted = {r for r, n in step.spec_tokens.items() if n > 0}
        for r in drafted:
            if computed.get(r, 0) < prefill.get(r, 0):
                seen.add("placeholder_drafts")
            elif step.spec_tokens[r] < max(step.spec_tokens.values()) and any(
                    computed.get(q, 0) + n >= prefill.get(q, 0) > computed.get(q, 0)
                    for q, n in step.num_scheduled_tokens.items()):
                seen.add("fewer_drafts_beside_final_chunk")
        for r in step.num_scheduled_tokens:
            computed[r] = computed.get(r, 0) + step.num_accepted(r)
            last_step[r] = k
    return seen


@pytest.mark.parametrize("corner", ["preempt_mid_prefill", "preempt_mid_spec",
                                    "abort_right_after_schedule", "resume_with_outputs",
                                    "placeholder_drafts", "fewer_drafts_beside_final_chunk"])
def test_each_lifecycle_corner_is_drawn(corner):
    from hypothesis import find

    # two draft rows of different widths beside a finishing prefill need three slots and K = 2
    wide = corner == "fewer_drafts_beside_final_chunk"
    configs = runner_configs(max_num_reqs=st.just(3) if wide else st.integers(1, 3),
                             max_num_batched_tokens=st.just(16), max_model_len=st.just(64),
                             num_speculative_tokens=st.just(2) if wide else st.integers(1, 2),
                             pcp_sizes=st.just(1), pp_sizes=st.just(1),
                             num_ubatches=st.just(1))  # micro-batching would turn the drafts off
    run = find(scheduler_steps(config=configs, min_steps=3, max_steps=8),
               lambda steps: corner in _corners(steps),
               settings=settings(max_examples=3000, database=None, deadline=None, derandomize=True,
                                 suppress_health_check=list(HealthCheck),
                                 phases=[Phase.generate]))  # the first drawn: no shrinking
    assert corner in _corners(run)


@FAST
@given(runner_configs(pcp_sizes=st.sampled_from((1, 2, 4)), cudagraph_modes=st.sampled_from(
    ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"))))
def test_graph_configs_are_ones_the_runner_accepts(config):
    config.validate()
    assert not (config.pcp_size > 1 and config.cudagraph_mode == "FULL")
    assert all(1 <= s <= config.max_num_batched_tokens for s in config.graph_capture_sizes)
    # eager configs name no sizes; a graph mode may name none (vLLM's config then derives them)
    assert config.cudagraph_mode != "NONE" or config.graph_capture_sizes == ()
    assert config.graph_capture_sizes == tuple(sorted(set(config.capture_sizes))) or config.cudagraph_mode == "NONE"


def _dcp_sizes_vllm_accepts(pcp: int, tp: int = 1) -> set[int]:
    """vllm/config/parallel.py (0.30.0-0.33.0): with PCP > 1, "DCP must be disabled,
    span the PCP axis, or span the full TP x PCP axis"; the rig runs TP 1."""
    return {1, pcp, tp * pcp}


@FAST
@given(runner_configs(pcp_sizes=st.sampled_from((2, 4, 8)), dcp_sizes=st.sampled_from((1, 2, 4))))
def test_pcp_worlds_draw_only_dcp_sizes_vllm_accepts(config):
    assert config.dcp_size in _dcp_sizes_vllm_accepts(config.pcp_size)


@pytest.mark.parametrize("pcp, dcp, expected", [(2, 2, 2), (4, 2, 4), (8, 2, 8), (4, 1, 1), (1, 2, 2)])
def test_a_dcp_drawn_under_pcp_spans_the_pcp_axis(pcp, dcp, expected):
    """DCP 2 with PCP 4 or 8 is refused by vLLM; the strategy draws DCP = PCP instead."""
    @settings(max_examples=5, deadline=None, database=None)
    @given(runner_configs(pcp_sizes=st.just(pcp), dcp_sizes=st.just(dcp), dcp_without_pcp=st.just(True)))
    def drawn(config):
        assert config.dcp_size == expected

    drawn()
