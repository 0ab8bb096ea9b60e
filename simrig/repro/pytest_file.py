"""``simrig repro``: a finding class as one standalone pytest file for vLLM's own tests.

``resolve_input`` finds the trace and class (a trace, or a class key with ``--trace`` or
``--report``); ``render`` turns them into literals in the file's template, which drives
the steps through the real ``execute_model`` and asserts the property the class
violates (``property_of``; which classes have one is
``simrig.findings.classes.standalone_property``). ``run_pytest`` runs it.

See docs/bisect.md, 'From finding to fix'.
"""

from __future__ import annotations

import os
import pprint
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from simrig.bisect.search import ClassKey
from simrig.errors import UsageError
from simrig.findings.classes import standalone_property
from simrig.reference.contract import CONTRACT
from simrig.repro.template import assemble
from simrig.repro_sampling import prompt_logprobs_file, top_p_file
from simrig.step import SYNTH_VOCAB_SIZE
from simrig.trace_io.trace import TraceError, read_trace

# a sampling class's file: vLLM's own function on the request's rows, no runner
SAMPLING_FILES = {m.CLASS: m for m in (top_p_file, prompt_logprobs_file)}

# Each property in the words of the vLLM code that gives it its meaning.
MEANING = {
    "dtype": "index arrays are int64 (combine_sampled_and_draft_tokens allocates logits_indices "
             "torch.int64), lengths and offsets int32, masks bool, in the real and the dummy batch alike",
    "present": "InputBatch's field comments name when a field may be None",
    "positions": "positions are the tokens' sequence positions: a row with query_len q and seq_len s "
                 "holds s-q, ..., s-1 (InputBatch: seq_lens, query_start_loc)",
    "block_tables": "gather_block_tables: every entry wholly below the window is replaced by the null "
                    "block, since a KV tile that straddles the window start can still load a freed, "
                    "reused block and 'masked-out NaN in such a tile propagates into the output'",
    "rows_past": "the block tables are the forward pass's persistent buffers ('Block tables used for "
                 "model's forward pass', BlockTables.__init__), read past a batch by a later padded batch "
                 "or graph replay: rows left by a larger batch must be cleared ('Also clear rows left by a "
                 "larger batch in the shared buffer', gather_block_tables)",
    "full_decode": "a uniform decode batch runs the FULL decode graph its rank-local batch fits "
                   "(CUDAGraphMode FULL_AND_PIECEWISE / FULL_DECODE_ONLY: FULL graphs for decode batches)",
    "lora": "CompilationConfig.cudagraph_specialize_lora: 'When set to False, the LoRA-enabled cuda "
            "graph will be used for all cases'",
    "lora_mapping": "LoRAMapping maps 'rows in a batch to LoRA ids' (convert_mapping) and "
                    "'token_lora_mapping[i] is the LoRA id to use for ith token' (make_lora_inputs): "
                    "each row and token its own request's adapter, 0 for the base model",
    "raises": "the scheduler output breaks the scheduler's contract on purpose; the runner must reject "
              "it loudly",
    "no_raise": "valid scheduler output must never make the runner raise",
}


# A class only simrig's kernel memory checker raises: the file runs vLLM without it.
MEMCHECK_ERRORS = ("KernelMemoryError", "KernelOverflowError")
MEMCHECK_NOTE = (
    "\nThis class needs simrig's memcheck to reproduce on CPU: simrig's kernel memory checker\n"
    "raised it, and this file runs vLLM without that checker, so on CPU the out-of-bounds\n"
    "access lands on the heap unseen and the test may pass. On CPU, replay the trace with\n"
    "`simrig replay TRACE` (memcheck on by default); on a GPU, run\n"
    "    compute-sanitizer --tool memcheck python -m pytest THIS_FILE\n"
    "(an overflow shows there only as the out-of-bounds access it leads to).\n")


def resolve_input(arg: str, cls: str | None, trace: str | None, report: str | None
                  ) -> tuple[Path, ClassKey]:
    """(trace, class) from the command line; UsageError naming the argument otherwise."""
    path = Path(arg)
    if path.is_file():
        key = ClassKey.parse(cls) if cls else None
        return path, key or _header_class(path)
    if path.exists():
        raise UsageError(f"CLASS_OR_TRACE {arg}: not a trace file")
    try:
        key = ClassKey.parse(arg, "CLASS_OR_TRACE")
    except UsageError:
        raise UsageError(f"CLASS_OR_TRACE {arg!r}: neither a trace file nor a class "
                         "kind:stage:field[:exception_type]") from None
    if trace:
        if not Path(trace).is_file():
            raise UsageError(f"--trace {trace}: no such trace file")
        return Path(trace), key
    if not report:
        raise UsageError(f"CLASS_OR_TRACE {arg}: a class needs --trace FILE or --report DIR "
                         "(whose classes.csv names its reproducer)")
    return _from_report(Path(report), key), key


def _header_class(path: Path) -> ClassKey:
    try:
        header, _ = read_trace(path)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    return ClassKey.from_header(header, str(path))


def _from_report(report: Path, key: ClassKey) -> Path:
    table = report / "classes.csv"
    if not table.is_file():
        raise UsageError(f"--report {report}: no classes.csv there (not a simrig report)")
    rows = [r for r in pd.read_csv(table, keep_default_na=False).to_dict("records") if key.matches(r)]
    if not rows:
        raise UsageError(f"--report {report}: classes.csv has no class {key.text}")
    trace = str(rows[0].get("reproducer") or rows[0].get("first_trace") or "")
    if not trace or not Path(trace).is_file():
        raise UsageError(f"--report {report}: the reproducer of {key.text} ({trace or 'none'}) "
                         "is not a readable trace")
    return Path(trace)


def _step_literal(step: Any) -> dict[str, Any]:
    return {
        "new": [{"id": r.req_id, "prompt_len": r.prompt_len, "prefill_len": r.num_prefill_tokens,
                 "num_computed_tokens": r.num_computed_tokens, "max_tokens": r.max_tokens,
                 "block_ids": [list(g) for g in r.block_ids] if r.block_ids and isinstance(
                     r.block_ids[0], (list, tuple)) else list(r.block_ids),
                 **({"lora_id": r.lora_id} if getattr(r, "lora_id", None) else {})}
                for r in step.new_requests],
        "cached": [{"id": c.req_id, "num_computed_tokens": c.num_computed_tokens,
                    "new_block_ids": None if c.new_block_ids is None else
                    [list(g) if isinstance(g, (list, tuple)) else g for g in c.new_block_ids]}
                   for c in step.cached],
        "num_scheduled_tokens": dict(step.num_scheduled_tokens),
        **({"spec_tokens": dict(step.spec_tokens)} if step.spec_tokens else {}),
        "finished": list(step.finished),
        "preempted": list(step.preempted),
        **({} if getattr(step, "idle_dummy", True) else {"idle_dummy": False})}


def property_of(key: ClassKey) -> str:
    """Which assertion of the template states the class; UsageError when none does."""
    prop = standalone_property(key.kind, key.stage, key.field)
    if prop is None:
        raise UsageError(f"class {key.text}: no standalone property for kind {key.kind} at stage "
                         f"{key.stage} (field {key.field or '-'}); see docs/bisect.md for the classes "
                         "simrig repro states")
    return prop


def class_literal(key: ClassKey, header: Any) -> dict[str, Any]:
    """What the test asserts, with the field's meaning; UsageError for a class it cannot state."""
    prop = property_of(key)
    declared = ""
    if prop == "dtype":
        contract = CONTRACT.get("prepare", {}).get(key.field)
        if contract is None:
            raise UsageError(f"class {key.text}: {key.field} is not in simrig's dtype contract, so "
                             "there is no property to assert")
        declared = f"torch.{contract.dtype}" if contract.kind == "torch" else f"numpy.{contract.dtype}"
    expected_raise = False
    if prop == "raises_or_not":
        expected_raise = (key.kind == "silent_acceptance" or bool(header.adversarial)
                          or bool(header.source.get("loud_rejection")))
        prop = "raises" if expected_raise else "no_raise"
    meaning = MEANING.get(prop, "")
    if prop == "present":
        meaning = f"a batch of the same shape carries it in the real step; {MEANING['present']}"
    return {"kind": key.kind, "stage": key.stage, "field": key.field, "property": prop,
            "exception_type": key.exception_type or ("KeyError" if key.kind == "key_error" else "Exception"),
            "declared": declared, "meaning": meaning}


def test_name(key: ClassKey) -> str:
    return re.sub(r"[^0-9a-zA-Z_]+", "_", f"{key.kind}_{key.stage}_{key.field}").strip("_").lower()


def render(trace: Path, key: ClassKey) -> str:
    try:
        header, steps = read_trace(trace)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if key.text in SAMPLING_FILES:
        return SAMPLING_FILES[key.text].render(trace.name, steps, test_name(key), SYNTH_VOCAB_SIZE)
    if header.adversarial and key.kind not in ("key_error", "exception", "silent_acceptance") \
            and not key.field.startswith("attn.block_tables."):
        raise UsageError(f"{trace}: an adversarial trace reproduces only key_error/exception classes "
                         "and block-table classes")
    cls = class_literal(key, header)
    c = header.config
    if c.dcp_size > 1:
        raise UsageError(f"{trace}: the standalone runner drives no DCP (dcp_size {c.dcp_size})")
    config = {k: getattr(c, k) for k in ("max_num_reqs", "max_num_batched_tokens", "max_model_len", "block_size",
              "num_speculative_tokens", "kv_groups", "pcp_size", "shard_decode_requests", "cudagraph_mode",
              "capture_sizes", "max_loras", "cudagraph_specialize_lora")}
    config.update(kv_groups=[{"kind": g.kind, "window": g.window} for g in c.kv_groups],
                  capture_sizes=list(c.capture_sizes))
    lines = ["CONFIG = " + pprint.pformat(config, width=100, sort_dicts=False),
             "CLASS = " + pprint.pformat(cls, width=100, sort_dicts=False),
             "# The scheduler's steps, one per line: new requests (prompt and prefill lengths, block",
             "# ids), cached requests (computed tokens, new block ids), tokens scheduled per request.",
             "STEPS = ["]
    lines += [f"    {_step_literal(s)!r}," for s in steps]
    lines.append("]")
    return assemble(_doc(trace, key, cls, header, len(steps)), "\n".join(lines), test_name(key))


def _doc(trace: Path, key: ClassKey, cls: dict[str, Any], header: Any, num_steps: int) -> str:
    stage = {"dummy": "GPUModelRunner._dummy_run", "profile": "GPUModelRunner.profile_run",
             "capture": "GPUModelRunner.capture_model"}.get(key.stage, "GPUModelRunner.execute_model")
    return (f"Reproducer for a vLLM Model Runner V2 input-path defect (written by simrig repro).\n\n"
            f"Finding class: {key.text}\nWhere it shows: {stage}\n"
            f"Property ({cls['property']}): {cls['meaning']}\n"
            f"Schedule: {num_steps} step(s), from {trace.name} ({header.source.get('kind', 'trace')}), "
            "each run through\nGPUModelRunner.execute_model as a worker runs it.\n\n"
            "Fails on a vLLM that shows the class, passes where it is fixed. Run: pytest -q THIS_FILE\n"
            "Needs only vllm, torch, numpy and pytest; without CUDA the runner is built on CPU and\n"
            "the MRV2 Triton kernels run in Triton's interpreter.\n"
            + (MEMCHECK_NOTE if key.exception_type in MEMCHECK_ERRORS else ""))


def write_and_check(out: Path, trace: Path, key: ClassKey, text: str, python: str | None,
                    where: str) -> int:
    """``simrig repro --pytest OUT.py``: write ``text`` to ``out`` whole (temporary file,
    rename); with ``python`` (--check) run it there and say whether the class shows on
    ``where`` (0 it shows, 1 it does not)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{out.name}-", dir=out.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, out)
    print(f"wrote {out}: {key.text} from {trace} ({len(text.splitlines())} lines); "
          f"run: pytest -q {out}")
    if python is None:
        return 0
    status, tail = run_pytest(python, out.resolve())
    if status not in (0, 1):
        raise UsageError(f"--check: pytest could not run the file on {where} (exit {status}): "
                         f"{tail.splitlines()[-1] if tail else ''}")
    # a loud rejection shows when its file passes; a silent acceptance when it fails
    loud = key.text not in SAMPLING_FILES and key.kind != "silent_acceptance" and class_literal(
        key, read_trace(trace)[0])["property"] == "raises"
    shows = (status == 1) != loud  # a loud rejection shows when its test passes
    verb = "passes" if status == 0 else "FAILS"
    what = (f"it reproduces {key.text}" if shows and not loud else
            f"the runner rejects the violation loudly ({key.text} shows)" if shows else
            f"the violation is accepted silently ({key.text} does not show)" if loud else
            f"{key.text} does not show there")
    print(f"check: {verb} on {where}: {what}")
    for line in tail.splitlines()[:1] if status == 1 else []:
        print(f"  {line.removeprefix('E').strip()}")
    return 0 if shows else 1


def run_pytest(python: str, file: Path, timeout: float = 900, env: dict[str, str] | None = None
               ) -> tuple[int, str]:
    """(pytest's exit status, its last lines) for ``file`` under ``python``, with simrig's
    pytest plugin off and no project configuration (the file stands alone)."""
    python = os.path.abspath(python) if os.sep in python else python  # it runs in the file's folder
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:simrig",
           "-c", os.devnull, "--rootdir", str(file.parent), str(file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=file.parent,
                          env=env, check=False)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    errors = [ln for ln in lines if re.match(r"^E\s+(AssertionError|Failed|\w+Error):", ln)]
    return proc.returncode, "\n".join(errors[:1] + lines[-3:])
