"""The drive section of a standalone reproducer: the schedule through the runner, as a worker runs it.

Text, never executed here (see ``cpu_runner``): one step as the release's SchedulerOutput,
``execute_model`` and the sampler's hand-back through vLLM's own ``postprocess_sampled``; the
worker's start-up ``profile_run`` and ``capture_model``; an idle data-parallel rank's
``_dummy_run``; a tap on the cudagraph manager's ``dispatch`` recording each descriptor it returns.
"""

DRIVE = r'''

def scheduler_output(step):
    """One step of the schedule as this release's SchedulerOutput."""
    def build(cls, **kw):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        args = {k: v for k, v in kw.items() if k in fields}
        for name, f in fields.items():  # num_common_prefix_blocks is required before 0.32
            if name not in args and f.init and f.default is dataclasses.MISSING \
                    and f.default_factory is dataclasses.MISSING:
                args[name] = []
        return cls(**args)

    groups = len(CONFIG["kv_groups"])
    new = []
    for q in step["new"]:
        ids = [token(q["id"], p) for p in range(q["prefill_len"])]
        lora = None
        if q.get("lora_id"):
            from vllm.lora.request import LoRARequest
            lora = LoRARequest(f"adapter-{q['lora_id']}", q["lora_id"], f"/adapters/{q['lora_id']}")
        new.append(build(sched.NewRequestData, req_id=q["id"], prompt_token_ids=ids[:q["prompt_len"]],
                         mm_features=[], sampling_params=SamplingParams(max_tokens=q["max_tokens"]),
                         pooling_params=None, block_ids=tuple(per_group(q["block_ids"], groups)),
                         num_computed_tokens=q["num_computed_tokens"], lora_request=lora,
                         prefill_token_ids=ids))
    cached = step["cached"]
    nst = step["num_scheduled_tokens"]
    return build(
        sched.SchedulerOutput, scheduled_new_reqs=new, total_num_scheduled_tokens=sum(nst.values()),
        scheduled_cached_reqs=build(
            sched.CachedRequestData, req_ids=[c["id"] for c in cached], resumed_req_ids=set(),
            new_token_ids=[[] for _ in cached], all_token_ids={}, num_output_tokens=[0 for _ in cached],
            num_computed_tokens=[c["num_computed_tokens"] for c in cached],
            new_block_ids=[None if c["new_block_ids"] is None else tuple(per_group(c["new_block_ids"], groups))
                           for c in cached]),
        num_scheduled_tokens=dict(nst), scheduled_encoder_inputs={},
        scheduled_spec_decode_tokens={k: [-1] * n for k, n in step.get("spec_tokens", {}).items() if n},
        finished_req_ids=set(step["finished"]), free_encoder_mm_hashes=[],
        preempted_req_ids=set(step["preempted"]) or None)


def per_group(block_ids, groups):
    """Block ids as one list per KV cache group (a flat list is group 0's)."""
    if block_ids and isinstance(block_ids[0], list):
        return [list(b) for b in block_ids]
    return [list(block_ids)] + [[] for _ in range(groups - 1)]


def token(req_id, position):
    """A token id for a position of a request (the schedule carries lengths only)."""
    return (zlib.crc32(req_id.encode()) * 31 + position * 2_654_435_761) % VOCAB


def run_step(runner, step):
    """One scheduler step through execute_model, then the sampler's hand-back:
    every request with a logit row samples one token (a stand-in sampler), and
    vLLM's own postprocess_sampled advances the requests' state."""
    with without_cuda():
        runner.execute_model(scheduler_output(step))
    state, runner.execute_model_state = runner.execute_model_state, None
    runner.forward_batch = None if state is None else state.input_batch  # the batch the forward ran
    if state is None:
        return
    batch = getattr(runner.pcp_manager, "_global_batch", None) or state.input_batch
    n = batch.num_reqs
    num_logits = np.diff(batch.cu_num_logits_np[: n + 1]).astype(np.int32)
    sampled = torch.tensor([[token(q, 0)] * max(int(num_logits.max()), 1) for q in batch.req_ids])
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    num_sampled, num_rejected = get_num_sampled_and_rejected(
        torch.from_numpy(num_logits).to(DEVICE), batch.seq_lens[:n], batch.cu_num_logits,
        batch.idx_mapping, runner.req_states.prefill_len.gpu)
    runner.postprocess_sampled(batch.idx_mapping, sampled.to(DEVICE), num_sampled, num_rejected,
                               batch.query_start_loc)


def dispatches(runner):
    """Record every descriptor the cudagraph manager dispatches (observing only)."""
    manager, seen = runner.cudagraph_manager, []
    real = manager.dispatch
    def dispatch(*a, **k):
        desc = real(*a, **k)
        seen.append(desc)
        return desc
    manager.dispatch = dispatch
    manager.run_fullgraph = lambda desc: torch.zeros(desc.num_tokens, HIDDEN)  # no CUDA graph to replay
    return seen


def profile_run(runner):
    """The worker's memory profile: GPUModelRunner.profile_run."""
    runner.model_state.path = "profile"
    try:
        with without_cuda():
            runner.profile_run()
    finally:
        runner.model_state.path, runner.execute_model_state = "step", None


def capture_model(runner):
    """The worker's start-up capture: GPUModelRunner.capture_model (no graph is recorded on CPU)."""
    from vllm.v1.worker import workspace
    if not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(DEVICE)
    runner.model_state.path = "capture"
    try:
        with without_cuda():
            runner.capture_model()
    finally:
        runner.model_state.path = "step"
        workspace.unlock_workspace()


def dummy_run(runner, num_tokens, uniform_decode=False):
    """An idle data-parallel rank's step: GPUModelRunner._dummy_run."""
    runner.model_state.path = "dummy"
    try:
        with without_cuda():
            runner._dummy_run(num_tokens, uniform_decode=uniform_decode)
    finally:
        runner.model_state.path, runner.execute_model_state = "step", None
'''
