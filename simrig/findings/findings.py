"""Findings: every way the real code disagreed with what simrig expected."""

from __future__ import annotations

import functools
import inspect
import traceback as tb
from collections.abc import Callable
from dataclasses import asdict, dataclass
from dataclasses import field as dc_field  # `field` is also a Finding attribute
from typing import Any, TypeVar

# The kinds, as users filter on them.
KEY_ERROR = "key_error"  # KeyError raised by the runner
DTYPE_DRIFT = "dtype_drift"  # a field's dtype broke the contract / parity / step-to-step
VALUE_MISMATCH = "value_mismatch"  # disagreement with the reference model or an invariant
EXCEPTION = "exception"  # any other exception raised by the runner on valid input
CONTRACT_VIOLATION_INPUT = "contract_violation_input"  # the input broke the scheduler contract
SILENT_ACCEPTANCE = "silent_acceptance"  # contract-violating input accepted without failing
MISSING_FIELD = "missing_field"  # a declared field is absent, or None where an array is due
RIG_ERROR = "rig_error"  # simrig's own code (a check, the harness) raised: never the runner's fault
KINDS = (KEY_ERROR, DTYPE_DRIFT, VALUE_MISMATCH, EXCEPTION, CONTRACT_VIOLATION_INPUT,
         SILENT_ACCEPTANCE, MISSING_FIELD, RIG_ERROR)


@dataclass
class Finding:
    kind: str
    step: int
    stage: str
    check: str  # which check produced it (contract, parity, reference, pcp, …)
    rank: int | None = None
    req_ids: tuple[str, ...] = ()
    field: str = ""
    expected: str = ""
    actual: str = ""
    message: str = ""
    exception_type: str = ""
    trace: str = ""  # source trace (or campaign example) it came from
    known: bool = False  # matches a documented known finding of this vLLM version
    traceback: str = ""  # rig_error only: where simrig's own code failed
    known_by: str = ""  # the known-findings file and entry that explained it ("FILE#i")
    # the input violation it follows from ("SIGNATURE at step K" of a trace that breaks the
    # scheduler contract without declaring it): counted on that class, never a class of its own
    caused_by: str = ""
    extra: dict[str, Any] = dc_field(default_factory=dict)

    @property
    def signature(self) -> tuple[str, str, str, str]:
        """Deduplication key: (kind, stage, field, exception type)."""
        return (self.kind, self.stage, self.field, self.exception_type)

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out["req_ids"] = ",".join(self.req_ids)
        out["rank"] = -1 if self.rank is None else self.rank
        out.pop("extra")
        return out

    def one_line(self) -> str:
        where = f"step {self.step} {self.stage}" + (f"[rank {self.rank}]" if self.rank is not None else "")
        what = f"{self.field}: " if self.field else ""
        detail = self.message or f"expected {self.expected}, got {self.actual}"
        ids = f" (requests {','.join(self.req_ids[:5])})" if self.req_ids else ""
        return f"{self.kind} at {where}: {what}{detail}{ids}"


# ------------------------------------------------------------------ rig errors
def rig_error(exc: BaseException, *, step: int, stage: str = "", check: str,
              rank: int | None = None, trace: str = "") -> Finding:
    """A ``rig_error`` finding for an exception raised by simrig's own code.

    The traceback travels in the finding (and so in the report's findings
    table), so the bug can be fixed from the report alone.
    """
    return Finding(kind=RIG_ERROR, step=step, stage=stage, check=check, rank=rank,
                   message=f"{check} raised {type(exc).__name__}: {str(exc)[:300]}",
                   exception_type=type(exc).__name__, trace=trace,
                   traceback="".join(tb.format_exception(exc))[-8000:])


F = TypeVar("F", bound=Callable[..., list[Finding]])


def guarded(check: str) -> Callable[[F], F]:
    """Decorate a check entry point ``(…, index, …) -> list[Finding]`` so an
    exception inside it comes back as one ``rig_error`` finding instead of
    stopping the run. ``index`` (the step) is read from the call's arguments.
    """
    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> list[Finding]:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 -- a check's bug is a finding
                try:
                    arguments = signature.bind(*args, **kwargs).arguments
                    index = int(arguments.get("index", -1))
                except (TypeError, ValueError):
                    arguments, index = {}, -1
                stage = arguments.get("stage")  # a StageObs when the check is per stage
                return [rig_error(exc, step=index, check=check, stage=str(getattr(stage, "stage", "")),
                                  rank=getattr(stage, "rank", None))]
        return run  # type: ignore[return-value]
    return wrap
