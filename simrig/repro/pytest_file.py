"""``simrig repro``: a finding class as one standalone pytest file for vLLM's own tests.

    CLASS_OR_TRACE ──► (trace, class) ──► STEPS, CONFIG, CLASS literals ──► repro_template ──► OUT.py

Input: a trace (a shrunk or regression trace; the class from ``--class`` or the
header's ``expect`` / ``source.signature``), or a class key ``kind:stage:field``
with ``--trace FILE`` or ``--report DIR`` (the class's reproducer in that
report's ``classes.csv``).

The file replays the trace's steps as SchedulerOutputs through the real runner
and asserts the property the class violates, in vLLM's words:

    kind            stage                           assertion
    dtype_drift     gather, prepare, dummy,         the field has the contract's dtype
                    partition                       (simrig.reference.contract); for dummy,
                                                    first the same dtype as prepare_inputs'
    missing_field   dummy                           None on one side iff on the other
                    gather, prepare, partition      not None outside the documented condition
    key_error,      lifecycle, gather, prepare,     valid input: the call never raises;
    exception       partition, postprocess, dummy   a loud rejection (expected class): it raises
                                                    the exception type

so it fails on a release that shows the class and passes where it is fixed.
Other kinds (value_mismatch, the checker's own notes) are refused with one line.
"""

from __future__ import annotations

import pprint
import re
import subprocess
from pathlib import Path
from typing import Any

from simrig.bisect.search import ClassKey
from simrig.errors import UsageError
from simrig.reference.contract import CONTRACT
from simrig.repro.template import TEMPLATE
from simrig.trace_io.trace import TraceError, read_trace

SUPPORTED = {"dtype_drift": ("gather", "prepare", "dummy", "partition"),
             "missing_field": ("gather", "prepare", "dummy", "partition"),
             "key_error": ("lifecycle", "gather", "prepare", "partition", "postprocess", "dummy"),
             "exception": ("lifecycle", "gather", "prepare", "partition", "postprocess", "dummy")}
WHY = {"dtype_drift": "index arrays are int64 (np.intp / torch.int64), lengths and offsets int32, "
                      "masks bool, in the real and the dummy batch alike",
       "missing_field": "InputBatch/BatchReqState field comments name when a field may be None"}


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
    import pandas as pd

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
        "new_requests": [{"id": r.req_id, "prompt_len": r.prompt_len, "prefill_len": r.num_prefill_tokens,
                          "num_computed_tokens": r.num_computed_tokens, "max_tokens": r.max_tokens,
                          "token_ids": list(r.prompt_token_ids) if r.prompt_token_ids else None,
                          "block_ids": list(r.block_ids)} for r in step.new_requests],
        "cached": [{"id": c.req_id, "num_computed_tokens": c.num_computed_tokens,
                    "new_block_ids": None if c.new_block_ids is None else list(c.new_block_ids),
                    "resumed": c.resumed} for c in step.cached],
        "num_scheduled_tokens": dict(step.num_scheduled_tokens), "spec_tokens": dict(step.spec_tokens),
        "rejected": dict(step.rejected), "finished": list(step.finished),
        "preempted": list(step.preempted)}


def class_literal(key: ClassKey, header: Any) -> dict[str, Any]:
    """What the test asserts; UsageError for a class it cannot state."""
    stages = SUPPORTED.get(key.kind)
    if stages is None:
        raise UsageError(f"class {key.text}: kind {key.kind} has no standalone reproducer "
                         f"(supported kinds: {', '.join(SUPPORTED)})")
    if key.stage not in stages:
        raise UsageError(f"class {key.text}: stage {key.stage} is not supported for {key.kind} "
                         f"(supported: {', '.join(stages)})")
    if key.field.startswith("manager."):
        raise UsageError(f"class {key.text}: the PCP manager's private arrays are not reproduced "
                         "standalone")
    contract = CONTRACT.get(key.stage, {}).get(key.field)
    if key.kind in ("dtype_drift", "missing_field") and contract is None:
        raise UsageError(f"class {key.text}: {key.stage}.{key.field} is not in simrig's dtype "
                         "contract, so there is no property to assert")
    raises = key.kind in ("key_error", "exception")
    expected = raises and (bool(header.adversarial) or bool(header.source.get("loud_rejection")))
    why = WHY.get(key.kind, "")
    if raises:
        why = ("the scheduler output breaks the scheduler's contract on purpose; the runner must "
               "reject it loudly" if expected else "valid scheduler output must never make the runner raise")
    return {"kind": key.kind, "stage": key.stage, "field": key.field,
            "exception_type": key.exception_type or ("KeyError" if key.kind == "key_error" else "Exception"),
            "expected_raise": expected,
            "declared": "" if contract is None else (f"torch.{contract.dtype}" if contract.kind == "torch"
                                                     else f"numpy.{contract.dtype}"),
            "none_when": "" if contract is None else contract.none_when, "why": why}


def test_name(key: ClassKey) -> str:
    return re.sub(r"[^0-9a-zA-Z_]+", "_", f"{key.kind}_{key.stage}_{key.field}").strip("_").lower()


def render(trace: Path, key: ClassKey) -> str:
    try:
        header, steps = read_trace(trace)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if header.adversarial and key.kind not in ("key_error", "exception"):
        raise UsageError(f"{trace}: an adversarial trace reproduces only key_error/exception classes")
    cls = class_literal(key, header)
    c = header.config
    config = {"max_num_reqs": c.max_num_reqs, "max_num_batched_tokens": c.max_num_batched_tokens,
              "max_model_len": c.max_model_len, "num_speculative_tokens": c.num_speculative_tokens,
              "pcp_size": c.pcp_size, "dcp_size": c.dcp_size,
              "shard_decode_requests": c.shard_decode_requests}
    if key.stage == "partition" and c.pcp_size <= 1:
        raise UsageError(f"{trace}: class {key.text} needs a PCP trace (config.pcp_size > 1)")
    lines = ["CONFIG = " + pprint.pformat(config, width=100, sort_dicts=False),
             "CLASS = " + pprint.pformat(cls, width=100, sort_dicts=False),
             "# The scheduler's steps (simrig trace format v1, defaults filled in): one per line.",
             "STEPS = ["]
    lines += [f"    {_step_literal(s)!r}," for s in steps]
    lines.append("]")
    return (TEMPLATE.replace("@@DOC@@", _doc(trace, key, cls, header, len(steps)))
            .replace("@@DATA@@", "\n".join(lines)).replace("@@TEST@@", test_name(key)))


def _doc(trace: Path, key: ClassKey, cls: dict[str, Any], header: Any, num_steps: int) -> str:
    if key.kind == "dtype_drift":
        prop = (f"InputBatch.make_dummy must build {key.field} with the dtype prepare_inputs builds, "
                f"and both must be {cls['declared']}" if key.stage == "dummy" else
                f"{key.stage}'s {key.field} must be {cls['declared']}")
    elif key.kind == "missing_field":
        prop = f"{key.stage}'s {key.field} must not be None where the real batch has it"
    elif cls["expected_raise"]:
        prop = f"the runner must raise {cls['exception_type']} in {key.stage} for a contract violation"
    else:
        prop = f"valid scheduler output must never make {key.stage} raise"
    mode = header.config.cudagraph_mode
    eager = "" if mode == "NONE" else f" Replayed eagerly (the trace's cudagraph mode {mode} is not)."
    return (f"Reproducer for a vLLM Model Runner V2 input-path defect (written by simrig repro).\n\n"
            f"Finding class: {key.text}\nProperty: {prop}.\n"
            f"Steps: {num_steps}, from {trace.name} ({header.source.get('kind', 'trace')}), replayed as "
            "SchedulerOutputs through\nGPUModelRunner's own finish/add/update_requests, "
            "gather_batch_req_state and prepare_inputs,\nPCPManager.partition_batch and "
            f"InputBatch.make_dummy.{eager}\n\n"
            "Fails on a vLLM that shows the class, passes where it is fixed. Run: pytest -q THIS_FILE\n"
            "Needs only vllm, torch, numpy and pytest; without CUDA it runs the MRV2 Triton kernels in\n"
            "Triton's interpreter.\n")


def run_pytest(python: str, file: Path, timeout: float = 900, env: dict[str, str] | None = None
               ) -> tuple[int, str]:
    """(pytest's exit status, its last lines) for ``file`` under ``python``, with simrig's
    pytest plugin off and no project configuration (the file stands alone)."""
    import os

    python = os.path.abspath(python) if os.sep in python else python  # it runs in the file's folder
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:simrig",
           "-c", os.devnull, "--rootdir", str(file.parent), str(file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=file.parent,
                          env=env, check=False)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    errors = [ln for ln in lines if re.match(r"^E\s+(AssertionError|Failed|\w+Error):", ln)]
    return proc.returncode, "\n".join(errors[:1] + lines[-3:])
