"""The grammar rule: each structured-output request's sampled row obeys its own bitmask.

For every request a step's ``grammar`` names whose row sampled (a spread row, observed where
vLLM's ``Sampler.sample`` returns), from what a grammar bitmask means (a token the grammar
does not allow can never be sampled):

    sampler.grammar_mask    the processed row is -inf at every token outside the allowed set
                            (the mask landed on this request's row, not on a neighbour's)
    sampler.grammar_token   the token sampled for the row, and the one handed to the
                            scheduler from it, lie inside the allowed set

Inside the set, the row is the oracle's ``sampler.processed_logits`` (a row flagged here is
left out of it: one misplaced mask, one finding per row). Under drafts every row of the
request is judged; row j hands out the request's token j (none past the first rejection).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.findings import findings as fk
from simrig.findings.findings import Finding
from simrig.observe import POSTPROCESS
from simrig.step import Step


def check_grammar(index: int, step: Step, seen: dict[str, Any], sampling: dict[str, int],
                  handed: dict[str, list]) -> tuple[list[Finding], set[str]]:
    """(findings, the requests they name) for the step's grammar requests among ``sampling``
    (spread request -> the position its row samples after)."""
    calls = seen.get("calls") or []
    if not step.grammar or not calls:
        return [], set()
    call, made_up = calls[-1], step.placeholder_drafts()
    out: list[Finding] = []
    for row, req_id, pos in seen["rows"]:
        allowed = step.grammar.get(req_id)
        if allowed is None or req_id not in sampling or row >= len(call.sampled):
            continue
        j = pos - sampling[req_id] + step.spec_tokens.get(req_id, 0)  # the row's index among the request's
        if j > 0 and req_id in made_up:
            continue  # after a placeholder draft (-1) the scheduler's row allows every token
        got = call.processed[row]
        mask = np.zeros(got.shape[0], dtype=bool)
        mask[list(allowed)] = True
        where = f"the row of {req_id} sampled after position {pos}"
        outside = np.isfinite(got) & ~mask
        if outside.any():
            t = int(np.flatnonzero(outside)[0])
            out.append(_finding(index, req_id, "sampler.grammar_mask", f"-inf outside the {len(allowed)} "
                                f"tokens its grammar allows", f"{int(outside.sum())} finite outside them "
                                f"(token {t}: {float(got[t]):.4g})",
                                f"{where} is masked by its own grammar bitmask row"))
        sampled = int(call.sampled[row])
        drawn = [*((("sampled", sampled),) if sampled >= 0 or j == 0 else ()),
                 *(("handed to the scheduler", int(t)) for t in list(handed.get(req_id, ()))[j:j + 1])]
        bad = [(what, t) for what, t in drawn if not (0 <= t < mask.size and mask[t])]
        if bad:
            what, t = bad[0]
            out.append(_finding(index, req_id, "sampler.grammar_token",
                                f"a token of the {len(allowed)} its grammar allows", f"{t} ({what})",
                                f"{where}: its token lies inside the set"))
    return out, {f.req_ids[0] for f in out}


def _finding(index: int, req_id: str, field_name: str, expected: str, actual: str, message: str) -> Finding:
    return Finding(kind=fk.VALUE_MISMATCH, step=index, stage=POSTPROCESS, check="sampling",
                   req_ids=(req_id,), field=field_name, expected=expected, actual=actual,
                   message=f"{message}: expected {expected}, got {actual}")
