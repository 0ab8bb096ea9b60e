"""Findings: every way the real code disagreed with what simrig expected."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from dataclasses import field as dc_field  # `field` is also a Finding attribute
from typing import Any

# The kinds, as users filter on them.
KEY_ERROR = "key_error"  # KeyError raised by the runner
DTYPE_DRIFT = "dtype_drift"  # a field's dtype broke the contract / parity / step-to-step
VALUE_MISMATCH = "value_mismatch"  # disagreement with the reference model or an invariant
EXCEPTION = "exception"  # any other exception raised by the runner on valid input
CONTRACT_VIOLATION_INPUT = "contract_violation_input"  # the input broke the scheduler contract
SILENT_ACCEPTANCE = "silent_acceptance"  # contract-violating input accepted without failing
KINDS = (KEY_ERROR, DTYPE_DRIFT, VALUE_MISMATCH, EXCEPTION, CONTRACT_VIOLATION_INPUT,
         SILENT_ACCEPTANCE)


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
    known_by: str = ""  # the known-findings file and entry that explained it ("FILE#i")
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
