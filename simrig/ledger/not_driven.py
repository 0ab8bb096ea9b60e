"""Paths of vLLM the rig does not drive, each with the reason and the lines that make it so.

The decisions table (decisions.py) holds every value a driven path hands on. A path that
no configuration the rig draws can reach is a row here instead: its reason, and the vLLM
(or rig) lines the reason rests on, re-read in the installed release and in each side
venv by ``tests/test_not_driven.py`` (``evidence.check_cite``), so a release that changes
them fails that test. ``not_driven_table()`` is the generated section of docs/decisions.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from simrig.ledger.evidence import Cite

BEGIN, END = "<!-- not-driven:begin -->", "<!-- not-driven:end -->"

_MR = "v1/worker/gpu/model_runner.py"
_DG = "model_executor/models/diffusion_gemma.py"


@dataclass(frozen=True)
class NotDriven:
    path: str  # the path, in words
    releases: str  # where the path exists as described
    reason: str
    evidence: tuple[Cite, ...]


NOT_DRIVEN: tuple[NotDriven, ...] = (
    NotDriven(
        "prepare_inputs' no-draft fast path with a ModelState that samples k != 1 tokens a step",
        "0.30.0 (0.31.0 takes the fast path only for k == 1)",
        "The fast path gives every request one logits row whatever the ModelState samples. The only "
        "in-tree ModelState with k != 1 is DiffusionGemmaModelState (k = 0), selected by a "
        "DiffusionGemma checkpoint; its sampler returns before reading the logits on a step with no "
        "drafts, so on 0.30.0 the extra rows are work, not output. The rig runs a ModelState stand-in "
        "with k = 1 over a tiny llama config: DiffusionGemma's state needs its Gemma4 model, "
        "diffusion config and canvas states, none of which cross the scheduler boundary",
        (Cite(_MR, "GPUModelRunner.prepare_inputs",
              "if not draft_tokens and self.model_state.num_new_sampled_tokens_per_step == 1:",
              {"0.30.0": "if not draft_tokens:"}),
         Cite("v1/worker/gpu/model_states/interface.py", "ModelState",
              "num_new_sampled_tokens_per_step: int = 1"),
         Cite(_DG, "DiffusionGemmaModelState", "num_new_sampled_tokens_per_step: int = 0"),
         Cite(_DG, "DiffusionGemmaForConditionalGeneration", "return DiffusionGemmaModelState"),
         Cite(_DG, "DiffusionSampler.__call__", "return self._handle_prefill(input_batch, device)"),
         Cite("simrig/adapters/standins.py", "ModelStateStandIn", "num_new_sampled_tokens_per_step = 1"))),
)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def not_driven_table() -> str:
    """docs/decisions.md's section of paths not driven."""
    out = ["| path | releases | not driven, because | evidence |", "|---|---|---|---|"]
    for row in NOT_DRIVEN:
        out.append(f"| {_cell(row.path)} | {_cell(row.releases)} | {_cell(row.reason)} | "
                   f"{_cell('; '.join(c.where() for c in row.evidence))} |")
    return "\n".join(out)
