"""LoRA dispatch, from what adapter counts and LoRA capture cases mean.

The oracle counts each batch's distinct adapters itself (``AdapterTracker``) and holds the
descriptor's ``num_active_loras`` to the smallest capture case that serves them
(``capture_cases``, ``dispatch_case``, ``check_lora_dispatch``); a graph mode captures
each case and no other (``check_lora_captures``).

See docs/cudagraph.md, 'The LoRA dispatch rules' for each rule and its vLLM source.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from simrig.findings import findings as fk
from simrig.findings.findings import Finding, guarded
from simrig.observe import CAPTURE, DISPATCH, StageObs
from simrig.reference.semantics import field_value
from simrig.step import RunnerConfig, Step

UNSPECIALIZED = "lora_free_graph_unspecialized"


def capture_cases(config: RunnerConfig) -> list[int]:
    """The active-adapter counts that get graphs of their own (the module's CAPTURE CASES)."""
    n = config.max_loras
    if n <= 0:
        return [0]
    if not config.cudagraph_specialize_lora:
        return [n + 1]
    powers = [p for p in (2 ** k for k in range(n.bit_length())) if p <= n]
    return sorted({0, n + 1, *(powers if config.specialize_active_lora else ())})


def dispatch_case(config: RunnerConfig, num_active: int) -> int:
    """The capture case a batch with ``num_active`` adapters runs under (DISPATCH CASE)."""
    cases = capture_cases(config)
    return min((c for c in cases if c >= num_active), default=cases[-1])


class AdapterTracker:
    """Each live request's adapter, from the steps alone (finished and
    preempted requests leave; a request sent as new brings its adapter)."""

    def __init__(self) -> None:
        self.adapter: dict[str, int] = {}

    def apply(self, step: Step) -> None:
        for req_id in (*step.finished, *step.preempted):
            self.adapter.pop(req_id, None)
        for req in step.new_requests:
            if req.lora_id is None:
                self.adapter.pop(req.req_id, None)
            else:
                self.adapter[req.req_id] = req.lora_id

    def num_active(self, req_ids: Iterable[str]) -> int:
        """Distinct adapters among ``req_ids`` (the module's ACTIVE COUNT)."""
        return len({self.adapter[r] for r in req_ids if r in self.adapter})


@guarded("lora_dispatch")
def check_lora_dispatch(index: int, config: RunnerConfig, desc: dict[str, Any] | None,
                        num_active: int, req_ids: tuple[str, ...] = ()) -> list[Finding]:
    """The step's descriptor runs the capture case of its active-adapter count."""
    if desc is None or desc.get("num_active_loras") is None:
        return []
    expected, actual = dispatch_case(config, num_active), int(desc["num_active_loras"])
    if actual == expected:
        return []
    pattern = UNSPECIALIZED if actual == 0 and not config.cudagraph_specialize_lora else ""
    return [Finding(kind=fk.VALUE_MISMATCH, step=index, stage=DISPATCH, check="lora_dispatch",
                    req_ids=req_ids, field="num_active_loras", expected=str(expected), actual=str(actual),
                    message=f"a batch with {num_active} active LoRA adapter(s) runs the graph of LoRA "
                            f"case {actual}; the capture cases are {capture_cases(config)}",
                    extra={"pattern": pattern} if pattern else {})]


@guarded("lora_capture")
def check_lora_captures(index: int, config: RunnerConfig, captures: list[StageObs]) -> list[Finding]:
    """The LoRA cases a graph mode captured are exactly the capture cases."""
    seen = {field_value(s, "desc.num_active_loras") for s in captures
            if s.stage == CAPTURE and s.error is None and s.fields}
    seen.discard(None)
    if not seen:  # eager, or a release without the field
        return []
    expected = set(capture_cases(config))
    if seen == expected:
        return []
    extra = sorted(seen - expected)
    pattern = UNSPECIALIZED if extra == [0] and not config.cudagraph_specialize_lora else ""
    return [Finding(kind=fk.VALUE_MISMATCH, step=index, stage=CAPTURE, check="lora_capture",
                    field="desc.num_active_loras", expected=str(sorted(expected)), actual=str(sorted(seen)),
                    message=f"graphs captured for LoRA cases {sorted(seen)}; max_loras {config.max_loras} "
                            f"documents {sorted(expected)}",
                    extra={"pattern": pattern} if pattern else {})]
