"""``simrig repro --upstream``: a finding ready for vLLM, as one folder.

``write_folder`` writes the trace, the standalone reproducer, ``ISSUE.md`` and
``verdict.json``; ``FINDINGS`` holds what a reviewer needs that the trace does not say
(the location, the vLLM line that gives the field its meaning). Expected verdicts
never come from a run: ``expected_verdicts`` reads them off the known findings;
``check_folder`` measures them (``--check``).

See docs/bisect.md, 'From finding to fix'.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simrig.bisect.search import ClassKey
from simrig.errors import UsageError
from simrig.findings.known import in_range
from simrig.repro.impact import IMPACT, section, tag
from simrig.trace_io.trace import read_trace

RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0")
KNOWN = Path(__file__).resolve().parents[2] / "reports" / "baselines" / "known-findings.json"


@dataclass(frozen=True)
class Upstream:
    """A finding's reviewer-facing text (vLLM 0.33.0 lines)."""

    title: str
    known: tuple[int, ...]  # known-findings.json entries of the class, on any release
    where: str  # file:line on 0.33.0
    evidence: str  # the vLLM line or comment that gives the meaning
    fix: str
    reproducer: str = ""  # how its file runs, where not the runner through execute_model


_IB = "vllm/v1/worker/gpu/input_batch.py"
FINDINGS: dict[str, Upstream] = {
    "dtype_drift:dummy:logits_indices": Upstream(
        "Dummy batch `logits_indices` is int32, the real batch's int64", (0, 1, 13),
        f"{_IB}:188 (`InputBatch.make_dummy`: `logits_indices = query_start_loc[1:] - 1`)",
        f"{_IB}:494, `combine_sampled_and_draft_tokens`: `logits_indices = torch.empty(num_logits, "
        "dtype=torch.int64, device=input_ids.device)`: the real batch's logits indices are int64; "
        "the dummy derives them from the int32 `query_start_loc`, so a graph captured on the dummy "
        "replays with another dtype",
        "`logits_indices = (query_start_loc[1:] - 1).to(torch.int64)` in `make_dummy`"),
    "missing_field:dummy:num_draft_tokens_per_req": Upstream(
        "Dummy batch `num_draft_tokens_per_req` is None under speculative decoding", (9,),
        f"{_IB}:206 (`InputBatch.make_dummy`: `num_draft_tokens=0, num_draft_tokens_per_req=None`)",
        "vllm/v1/worker/gpu/model_runner.py:1427-1429, `prepare_inputs`: whenever drafts are "
        "scheduled, `num_draft_tokens_per_req = batch_req_state.num_draft_tokens_np` (zeros when "
        "None): a spec-decode batch always carries an int32 array, so a graph captured on the dummy "
        "(the same shape) never sees per-request draft counts",
        "give `make_dummy` the per-request draft counts of the shape it stands for (zeros, or "
        "`decode_query_len - 1` per row for a uniform spec-decode dummy) when the runner drafts"),
    "value_mismatch:dummy:positions": Upstream(
        "Dummy batch positions are all zero", (12, 14),
        f"{_IB}:183 (`InputBatch.make_dummy`: `positions = input_buffers.positions[:num_tokens].zero_()`)",
        "`make_dummy` builds rows of up to ceil(num_tokens/num_reqs) tokens over no context "
        "(`seq_lens` = query length, `query_start_loc` per row), so row i's tokens sit at positions "
        "0..q-1; zero-filled positions contradict the batch's own `seq_lens`",
        "fill each row with `arange(query_len)` (positions = seq_len - query_len + j), e.g. "
        "`positions[:] = arange(num_tokens) - repeat_interleave(query_start_loc[:-1], query_lens)`"),
    "value_mismatch:profile:positions": Upstream(
        "The profile run embeds every token at position 0", (33,),
        "vllm/v1/worker/gpu/model_runner.py:1022 (`profile_run` -> `_dummy_run(max_num_tokens, "
        f"is_profile=True)`) -> {_IB}:183",
        "the profile run's batch is `make_dummy`'s: rows of ceil(num_tokens/num_reqs) tokens over no "
        "context whose `seq_lens` claim positions 0..q-1, while `positions` is zero-filled, so the "
        "profiling forward's rotary-embedding inputs are those of no real step",
        "the same fix as the dummy positions (`make_dummy` fills each row's positions 0..q-1)"),
    "value_mismatch:dispatch:cg_mode": Upstream(
        "PCP decode sharding never gets its FULL decode graph", (17, 18),
        "vllm/v1/worker/gpu/model_runner.py:1813-1836 (`execute_model`: `num_toks = "
        "self.pcp_manager.get_num_tokens_for_dispatch(...)`, then `dispatch_cg_and_sync_dp("
        "self.cudagraph_manager, num_reqs, num_toks, ...)`)",
        "with `shard_decode_requests` each PCP rank runs only its share of the decodes; the dispatch "
        "pairs the global `num_reqs` with the largest rank-local token count, and a uniform-decode "
        "graph of that many tokens holds fewer requests than `num_reqs`, so the FULL graph the "
        "rank-local batch fits is refused (PIECEWISE under FULL_AND_PIECEWISE, eager under "
        "FULL_DECODE_ONLY)",
        "dispatch decode-sharded batches with the rank-local request count (the PCP manager knows "
        "it), the count that goes with `get_num_tokens_for_dispatch`'s token count"),
    "value_mismatch:capture:desc.num_active_loras": Upstream(
        "`cudagraph_specialize_lora=False` still captures LoRA-free graphs", (25, 26),
        "vllm/v1/worker/gpu/lora_utils.py:35 (`get_lora_capture_cases`: `return [0, "
        "lora_config.max_loras + 1]` when not specializing)",
        "vllm/config/compilation.py:664, `CompilationConfig.cudagraph_specialize_lora`: \"When set to "
        "False, the LoRA-enabled cuda graph will be used for all cases, incurring the overhead of "
        "running LoRA ops even when no adapters are active\"; V1's `CudagraphDispatcher` captures "
        "only the LoRA-enabled case",
        "return `[lora_config.max_loras + 1]` from `get_lora_capture_cases` when "
        "`cudagraph_specialize_lora` is False (and dispatch LoRA-free batches to it)"),
    "value_mismatch:prepare:attn.block_tables.1": Upstream(
        "A sliding window of 1 never nulls the entries below the window", (27, 28, 29, 30, 31, 32),
        "vllm/v1/worker/gpu/block_table.py:54-63 (`BlockTables.__init__`: `sliding_window_reach` "
        "from `SlidingWindowSpec.num_retained_tokens`, \"0 disables it for the group\")",
        "`gather_block_tables`' docstring: sliding-window groups get \"every entry wholly below the "
        "window\" replaced by the null block, since a KV tile that straddles the window start can "
        "still load a freed, reused block and \"masked-out NaN in such a tile propagates into the "
        "output\"; window 1 has `num_retained_tokens` 0, read as \"not a sliding-window group\"",
        "mark sliding-window groups by the spec's kind (e.g. `sliding_window_reach=None` for full "
        "attention, or `has_sliding_window_groups` from the specs), so a reach of 0 still nulls"),
    "value_mismatch:partition:attn.filled_rows_past.0": Upstream(
        "Under PCP the rank-local block tables keep rows left by a larger batch",
        (46, 47, 48, 49, 50, 51, 52, 53, 54),
        "vllm/v1/worker/gpu/pcp_manager.py:777-782 (`PCPManager.prepare_attn`: "
        "`gather_block_tables(..., out=self._local_block_tables, ...)`) and :765-769 "
        "(`get_dummy_block_tables`: `block_table[:num_reqs].zero_()`); block_table.py:188-192 "
        "(`_num_dirty_rows` kept only `if out is None`)",
        "block_table.py:196, `gather_block_tables`: \"Also clear rows left by a larger batch in the "
        "shared buffer.\" and :225, `get_dummy_block_tables`: \"Profiling may populate the returned "
        "rows with valid block IDs.\": 0.33.0 clears the rows a larger batch left in the runner's own "
        "tables, but the PCP manager's rank-local tables (more rows than max_num_seqs when a prefill "
        "is split across ranks) are gathered with `out=` and zeroed only up to the dummy's request "
        "count, so a decode after a split prefill leaves the prefill's rows in them",
        "track dirty rows for the `out=` tables too (e.g. per output buffer in `gather_block_tables`), "
        "and have `PCPManager.get_dummy_block_tables` zero up to the larger of its request count and "
        "the rows last gathered"),
    "value_mismatch:postprocess:sampler.processed_logits": Upstream(
        "Triton top-p keeps the whole vocabulary of a low-temperature row", (70,),
        "vllm/v1/sample/ops/topk_topp_triton.py:645 (`_topk_topp_kernel`, top-p-only rows: `max_sample = avg_logit "
        "+ std_logit * 10.0`), from `Sampler.sample` (vllm/v1/worker/gpu/sample/sampler.py:347, `apply_top_k_top_p`)",
        "vllm/sampling_params.py:316, `SamplingParams.top_p`: \"Controls the cumulative probability of the top "
        "tokens to consider\". The kernel normalises by exp(logit - max_sample), max_sample an estimate of the "
        "row's largest logit: on a peaked row (temperature 0.0758) every exp underflows in float32, the "
        "probabilities are 0/0, no pivot is found and nothing is masked, where `apply_top_k_top_p_pytorch` keeps "
        "the top-p set (1 token). On CUDA: top-p-only rows of batches over 64 rows (`_SPLIT_MAX_BATCH`).",
        "shift by the row's true maximum (online softmax, as the split pipeline's `_topp_sb_stats_kernel` does)",
        "hands the request's logit row, as the trace names it, to `apply_top_k_top_p`, which `Sampler.sample` "
        "calls (65 copies on CUDA, past the split pipeline's 64 rows; on CPU in Triton's interpreter):"),
    "value_mismatch:postprocess:output.prompt_logprobs": Upstream(
        "Prompt logprobs past the prompt when a final prefill chunk carries placeholder drafts", (71,),
        "vllm/v1/worker/gpu/sample/prompt_logprob.py:191-192 (`PromptLogprobsWorker.compute_prompt_logprobs`: "
        "`if not req_is_prompt_chunked: end_idx -= 1`), with vllm/v1/core/sched/scheduler.py:1308-1330 (\"Pad new "
        "decode requests to uniform spec decoding size\": `num_new_tokens = padded_num_tokens`)",
        "vllm/sampling_params.py:350-351, `SamplingParams.prompt_logprobs`: \"Number of log probabilities to return "
        "per prompt token.\" A prompt of L tokens has L - 1 rows. The worker drops one row from a final chunk, "
        "assuming its last query token is the prompt's last; a request sent with one prompt token left (a remote KV "
        "load, a prefix-cache hit) is padded to 1 + K tokens of placeholder drafts, so K rows past the prompt are "
        "handed out.",
        "end the rows at the prompt's last position: `end_idx = start_idx + min(end_idx - start_idx - 1, "
        "prompt_len - 1 - num_computed_prefill_tokens)`",
        "hands `PromptLogprobsWorker.compute_prompt_logprobs` the request's final chunk as the scheduler sends it, "
        "the prompt's last token and K placeholder rows (an `InputBatch`'s fields the worker reads):"),
}


def expected_verdicts(known: tuple[int, ...], path: Path = KNOWN) -> dict[str, str]:
    """'fails' on each release an entry of the class covers, 'passes' elsewhere."""
    entries = json.loads(path.read_text())["findings"]
    ranges = [entries[i].get("vllm", "") for i in known]
    return {r: "fails" if any(in_range(r, spec) for spec in ranges) else "passes"
            for r in RELEASES}


def write_folder(folder: Path, trace: Path, key: ClassKey, text: str) -> Path:
    """Write the folder for ``key``; the reproducer's text is ``text``. Returns the test file::

        reports/upstream/<name>/
            trace.jsonl     the minimal schedule (simrig trace format)
            test_<name>.py  the standalone reproducer (pytest_file.render)
            ISSUE.md        what, where (file:line on the release), evidence, the impact (what a
                            user sees, ``impact.py``; it sets the title's [Bug] or [Misc]), the
                            schedule as a table, the reproducer, a suggested fix
            verdict.json    the expected verdict per release, from the known findings' version
                            ranges (fails where an entry covers the release, passes elsewhere),
                            and the verdicts ``--check`` measured
    """
    info = FINDINGS.get(key.text)
    if info is None:
        raise UsageError(f"--upstream: class {key.text} has no upstream entry "
                         f"(known: {', '.join(sorted(FINDINGS))})")
    if key.text not in IMPACT:  # never a folder without its Impact section
        raise UsageError(f"--upstream: class {key.text} has no impact entry: write what a user "
                         "sees in simrig/repro/impact.py (IMPACT) first")
    folder.mkdir(parents=True, exist_ok=True)
    name = folder.name.replace("-", "_")
    test = folder / f"test_{name}.py"
    test.write_text(text)
    if trace.resolve() != (folder / "trace.jsonl").resolve():
        shutil.copyfile(trace, folder / "trace.jsonl")
    verdict_path = folder / "verdict.json"
    measured = json.loads(verdict_path.read_text()).get("measured", {}) if verdict_path.exists() else {}
    verdict = {"class": key.text, "test": test.name, "trace": "trace.jsonl",
               "known_findings": [f"known-findings.json#{i}" for i in info.known],
               "expected": expected_verdicts(info.known), "measured": measured}
    verdict_path.write_text(json.dumps(verdict, indent=1) + "\n")
    (folder / "ISSUE.md").write_text(issue_text(info, key, trace, test))
    return test


def issue_text(info: Upstream, key: ClassKey, trace: Path, test: Path) -> str:
    header, steps = read_trace(trace)
    # the idle dummy's column only where a step goes on without it (older folders read as before)
    idle = not all(s.idle_dummy for s in steps)
    rows = ["| step | new requests (prompt) | cached requests (computed) | scheduled tokens |"
            + (" idle dummy after |" if idle else ""), "|---|---|---|---|" + ("---|" if idle else "")]
    for i, s in enumerate(steps):
        new = ", ".join(f"{r.req_id} ({r.prompt_len}" + ("; " + ", ".join(f"{k} {v}" for k, v in r.sampling
                        .to_json().items()) if r.sampling else "") + ")" for r in s.new_requests) or "-"
        cached = ", ".join(f"{c.req_id} ({c.num_computed_tokens})" for c in s.cached) or "-"
        nst = ", ".join(f"{k}: {v}" for k, v in s.num_scheduled_tokens.items()) or "-"
        rows.append(f"| {i} | {new} | {cached} | {nst} |"
                    + ((" yes |" if s.idle_dummy else " no |") if idle else ""))
    c = header.config
    config = ", ".join(f"{k}={v}" for k, v in (
        ("max_num_seqs", c.max_num_reqs), ("max_num_batched_tokens", c.max_num_batched_tokens),
        ("max_model_len", c.max_model_len), ("block_size", c.block_size), ("cudagraph_mode", c.cudagraph_mode),
        ("capture_sizes", list(c.capture_sizes)), ("prefill_context_parallel_size", c.pcp_size),
        ("shard_decode_requests", c.shard_decode_requests), ("max_loras", c.max_loras),
        ("cudagraph_specialize_lora", c.cudagraph_specialize_lora),
        ("kv_groups", [g.kind + (f"(window={g.window})" if g.window else "") for g in c.kv_groups])))
    expected = expected_verdicts(info.known)
    impact = IMPACT[key.text]
    return "\n".join([
        f"# {tag(impact.visible)}[MRV2] {info.title}", "",
        "## What", "", f"{info.title}. Finding class `{key.text}` "
        f"({', '.join(f'known-findings.json#{i}' for i in info.known)}).", "",
        "## Where (vLLM 0.33.0)", "", info.where, "",
        "## Evidence", "", info.evidence, "",
        *section(impact), "",
        "## Minimal schedule", "", f"Config: {config}.", "", *rows, "",
        "## Reproducer", "",
        f"`{test.name}` (next to this file) imports only vllm, torch, numpy and pytest. It " + (
            info.reproducer or "builds GPUModelRunner on CPU without a model (MRV2's Triton kernels in "
            "Triton's interpreter) and runs the schedule through `execute_model` (and `profile_run` / "
            "`capture_model` / `_dummy_run` where the class lives):"), "",
        f"    pytest -q {test.name}", "",
        "Expected per release: " + ", ".join(f"{r} {v}" for r, v in expected.items()) + ".", "",
        "## Suggested fix", "", info.fix, ""])


def read_verdict(folder: Path) -> dict[str, Any]:
    """A folder's verdict.json; UsageError naming the file and what is wrong."""
    path = folder / "verdict.json"
    try:
        verdict = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--check {folder}: no verdict.json there (write it with --upstream)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not readable JSON ({exc})") from None
    for key in [k for k in ("test", "expected") if k not in verdict][:1]:
        raise UsageError(f"{path}: field {key!r} missing")
    if not (folder / str(verdict["test"])).is_file():
        raise UsageError(f"{path}: field 'test': no file {verdict['test']} in {folder}")
    return verdict


def check_folder(folder: Path, pythons: dict[str, str], run: Any) -> tuple[dict[str, str], bool]:
    """Run the folder's test under each release's interpreter (``pythons``); record what
    was measured in verdict.json. Returns (verdict per release, all as expected)."""
    verdict = read_verdict(folder)
    test, measured = folder / verdict["test"], {}
    for release, python in pythons.items():
        status, tail = run(python, test.resolve())
        first = tail.splitlines()[0] if tail else ""
        # the property fails as an AssertionError; any other failure is the file's own trouble
        measured[release] = ("passes" if status == 0 else "fails" if status == 1
                             and first.lstrip("E ").startswith("AssertionError") else
                             f"error (pytest exit {status}: {first.lstrip('E ')[:120]})")
    verdict["measured"] = {**verdict.get("measured", {}), **measured}
    (folder / "verdict.json").write_text(json.dumps(verdict, indent=1) + "\n")
    ok = all(measured[r] == verdict["expected"].get(r) for r in measured)
    return measured, ok


def print_folder_check(folder: Path, pythons: dict[str, str], run: Any) -> int:
    """``simrig repro --check FOLDER``: ``check_folder``, then one line per release (those
    without an interpreter in ``pythons``: not run); 0 when every verdict is the expected one."""
    measured, ok = check_folder(folder, pythons, run)
    expected = read_verdict(folder)["expected"]
    for release in RELEASES:
        got = measured.get(release, "not run (no side venv)")
        mark = "" if release not in measured else "  ok" if got == expected[release] else "  DIFFERS"
        print(f"{folder.name}: vLLM {release}: {got} (expected {expected[release]}){mark}")
    return 0 if ok else 1


def verdict_table(root: Path = KNOWN.parents[1] / "upstream") -> str:
    """The folders' verdicts as a markdown table: measured where --check ran (with the
    expected one when they differ), else the expected one marked as not measured."""
    rows = ["| folder | class | " + " | ".join(RELEASES) + " |", "|---|---|" + "---|" * len(RELEASES)]
    for folder in sorted(p for p in root.iterdir() if (p / "verdict.json").is_file()):
        verdict = json.loads((folder / "verdict.json").read_text())
        pairs = [(verdict["expected"][r], verdict.get("measured", {}).get(r)) for r in RELEASES]
        cells = [f"expected {want}, not measured" if got is None else got if got == want else
                 f"**{got}** (expected {want})" for want, got in pairs]
        rows.append(f"| `{folder.name}` | `{verdict['class']}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)
