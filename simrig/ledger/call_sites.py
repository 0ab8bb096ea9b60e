"""The arguments vLLM's own call sites hand on, read off the installed source.

The decisions table (``simrig/ledger/decisions.py``) lists what the harness observes;
this module lists what vLLM *passes* at each ``CallSite`` in ``SITES`` (the model, the
attention builders, the sampler, ``_set_active_loras``, graph dispatch and replay, the
scheduler). ``call_site_arguments`` parses the vllm package as text, never importing
it; every ``Argument`` must be a row of ``simrig/ledger/call_rows.py``, or
``tests/test_call_sites.py`` fails.

See docs/decisions.md, 'Every argument at vLLM's call sites'.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

MODEL_RUNNER = "v1/worker/gpu/model_runner.py"
CUDAGRAPH = "v1/worker/gpu/cudagraph_utils.py"


@dataclass(frozen=True)
class CallSite:
    """Calls of ``callee`` inside ``caller`` (nested functions included) of ``file``.

    ``callee`` is the call's function as source text (``self.sampler``), or ``{name}`` for a
    dict literal assigned to ``name`` (the model's keyword arguments are built that way)."""

    name: str  # the receiver, as the table names it
    file: str  # relative to the vllm package
    caller: str  # "Class.method" or "function"
    callee: str
    # releases whose source has no such call (the receiver or the path does not exist there)
    absent_in: tuple[str, ...] = ()


_EXEC = "GPUModelRunner.execute_model"
_SAMPLE_TOKENS = "GPUModelRunner.sample_tokens"
_CAPTURE = "ModelCudaGraphManager.capture"
_TO_CAPTURE = "prepare_inputs_to_capture"
_033_ONLY = ("0.30.0", "0.31.0", "0.32.0")

SITES: tuple[CallSite, ...] = (
    # the model (eager and PIECEWISE: a call; FULL: the replay reads the staged buffers)
    CallSite("the model's inputs", MODEL_RUNNER, _EXEC, "{model_inputs}"),
    CallSite("the model", MODEL_RUNNER, _EXEC, "self.model"),
    CallSite("the PIECEWISE graph", MODEL_RUNNER, _EXEC, "self.cudagraph_manager.run_pw_graph"),
    CallSite("the FULL graph replay", MODEL_RUNNER, _EXEC, "self.cudagraph_manager.run_fullgraph"),
    CallSite("the forward context", MODEL_RUNNER, _EXEC, "set_forward_context"),
    CallSite("the batch descriptor", MODEL_RUNNER, _EXEC, "BatchDescriptor"),
    CallSite("the graph dispatch", MODEL_RUNNER, _EXEC, "dispatch_cg_and_sync_dp"),
    # the batch and the attention metadata builders
    CallSite("the request-state gather", MODEL_RUNNER, _EXEC, "self.gather_batch_req_state"),
    CallSite("the input batch", MODEL_RUNNER, _EXEC, "self.prepare_inputs"),
    CallSite("the dummy batch", MODEL_RUNNER, _EXEC, "InputBatch.make_dummy"),
    CallSite("the attention builders", MODEL_RUNNER, _EXEC, "self.model_state.prepare_attn"),
    CallSite("the DCP lengths", MODEL_RUNNER, _EXEC, "prepare_dcp_local_seq_lens",
             absent_in=("0.30.0",)),
    CallSite("the per-layer slot mappings", MODEL_RUNNER, _EXEC, "build_slot_mappings_by_layer"),
    # LoRA
    CallSite("the LoRA inputs", MODEL_RUNNER, _EXEC, "self.lora_state.make_lora_inputs"),
    CallSite("_set_active_loras", MODEL_RUNNER, _EXEC, "self._set_active_loras"),
    # the sampler, the rejection sampler, the state write-back and the scheduler
    CallSite("sample", MODEL_RUNNER, _SAMPLE_TOKENS, "self.sample"),
    CallSite("the logits", MODEL_RUNNER, "GPUModelRunner.sample", "self.model.compute_logits"),
    CallSite("the sampler", MODEL_RUNNER, "GPUModelRunner.sample", "self.sampler"),
    CallSite("the rejection sampler", MODEL_RUNNER, "GPUModelRunner.sample", "self.rejection_sampler"),
    CallSite("the state write-back", MODEL_RUNNER, _SAMPLE_TOKENS, "self.postprocess_sampled"),
    CallSite("post_update", MODEL_RUNNER, "GPUModelRunner.postprocess_sampled", "post_update"),
    CallSite("the scheduler's output", MODEL_RUNNER, _SAMPLE_TOKENS, "ModelRunnerOutput"),
    CallSite("the async output", MODEL_RUNNER, _SAMPLE_TOKENS, "AsyncOutput"),
    # pipeline ranks
    CallSite("the PP broadcast", MODEL_RUNNER, _SAMPLE_TOKENS, "self.pp_handler.broadcast"),
    CallSite("the PP receive", MODEL_RUNNER, _SAMPLE_TOKENS, "self.pp_handler.receive"),
    # the dummy paths: the idle dummy, the profile run, capture
    CallSite("the dummy step", MODEL_RUNNER, "GPUModelRunner._dummy_run", "self.execute_model"),
    CallSite("the profile run", MODEL_RUNNER, "GPUModelRunner.profile_run", "self._dummy_run"),
    CallSite("the capture warm-up", MODEL_RUNNER, "GPUModelRunner.capture_model", "self._dummy_run"),
    CallSite("capture", MODEL_RUNNER, "GPUModelRunner.capture_model", "self.cudagraph_manager.capture"),
    CallSite("the captured model's inputs", CUDAGRAPH, _CAPTURE, "{model_inputs}"),
    CallSite("the captured model", CUDAGRAPH, _CAPTURE, "model"),
    CallSite("the capture LoRA hook", CUDAGRAPH, _CAPTURE, "lora_capture_hook"),
    CallSite("the capture batch", CUDAGRAPH, _CAPTURE, "prepare_inputs_to_capture"),
    CallSite("the capture forward context", CUDAGRAPH, _CAPTURE, "set_forward_context"),
    CallSite("the capture batch descriptor", CUDAGRAPH, _CAPTURE, "BatchDescriptor"),
    CallSite("the capture dummy batch", CUDAGRAPH, _TO_CAPTURE, "InputBatch.make_dummy"),
    CallSite("the capture attention builders", CUDAGRAPH, _TO_CAPTURE, "model_state.prepare_attn"),
    CallSite("the capture DCP lengths", CUDAGRAPH, _TO_CAPTURE, "prepare_dcp_local_seq_lens",
             absent_in=("0.30.0",)),
    CallSite("the capture DCP context", CUDAGRAPH, _TO_CAPTURE, "set_dcp_capture_context",
             absent_in=_033_ONLY),
)


@dataclass(frozen=True)
class Argument:
    site: str  # CallSite.name
    key: str  # a keyword's name, a dict literal's key, or a positional argument's source text
    text: str  # the source text of the value handed on

    @property
    def row(self) -> tuple[str, str]:
        return (self.site, self.key)


def _find(tree: ast.AST, qualname: str) -> ast.AST | None:
    node: ast.AST | None = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
    return node


def _call_arguments(site: CallSite, call: ast.Call) -> list[Argument]:
    out = [Argument(site.name, ("*" if isinstance(a, ast.Starred) else "") + ast.unparse(
        a.value if isinstance(a, ast.Starred) else a), ast.unparse(a)) for a in call.args]
    for kw in call.keywords:
        key = kw.arg if kw.arg is not None else "**" + ast.unparse(kw.value)
        out.append(Argument(site.name, key, ast.unparse(kw.value)))
    return out


def _dict_arguments(site: CallSite, node: ast.Dict) -> list[Argument]:
    return [Argument(site.name, ast.literal_eval(k) if k is not None else "**" + ast.unparse(v),
                     ast.unparse(v)) for k, v in zip(node.keys, node.values)]


def site_arguments(site: CallSite, source: str) -> list[Argument] | None:
    """Every argument of ``site`` in one module's source, in order, once each; None when the
    caller or every such call is absent."""
    caller = _find(ast.parse(source), site.caller)
    if caller is None:
        return None
    found: list[Argument] = []
    seen = False
    for node in ast.walk(caller):
        if site.callee.startswith("{"):
            name = site.callee.strip("{}")
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
                seen = True
                found += _dict_arguments(site, node.value)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == site.callee:
            seen = True
            found += _call_arguments(site, node)
    if not seen:
        return None
    return list({a.key: a for a in found}.values())


def call_site_arguments(root: Path) -> tuple[list[Argument], list[CallSite]]:
    """(every argument of every site, the sites not found) in the vllm package at ``root``.

    Text only, never an import. Every argument of each site is one ``Argument``, which must
    be a row of ``call_rows.ROWS`` (judged by named decisions, or a reason with cited vLLM
    lines)::

        execute_model                                  ROWS[("the sampler", "input_batch")]
          self.sampler(logits, input_batch)   ──────►  judged by: prepare.logits_indices, ...
                       ^^^^^^  ^^^^^^^^^^^
                       one Argument each
    """
    arguments: list[Argument] = []
    missing: list[CallSite] = []
    sources: dict[str, str] = {}
    for site in SITES:
        if site.file not in sources:
            sources[site.file] = (root / site.file).read_text(encoding="utf-8")
        found = site_arguments(site, sources[site.file])
        if found is None:
            missing.append(site)
        else:
            arguments += found
    return arguments, missing
