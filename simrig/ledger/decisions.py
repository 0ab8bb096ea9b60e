"""Every decision of a step, path by path: the value execute_model hands on, and who judges it.

A row is (path, stage, field): a value one of vLLM's paths through ``execute_model`` (a
real step, a spec-decode step, a PCP rank, the idle DP dummy, the profile run, a capture
dummy) hands to the model, the attention metadata builders, the sampler, the graph replay,
the other PCP ranks or the scheduler. Its verdict is the check that judges it
(``unchecked.VALUE_CHECKED``) or the reason it is not, with the vLLM lines that make the
reason true (``evidence.REASONS``). The rows are generated from those tables and the
stages the harness observes; ``tests/test_field_coverage.py`` holds every field the probes
observe to a row, and ``tests/test_decisions.py`` keeps docs/decisions.md equal to
``decisions_table()`` and fails on a row with neither a check nor an evidenced reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simrig.ledger.call_rows import ROWS
from simrig.ledger.call_sites import SITES
from simrig.ledger.evidence import REASONS, RIG, Cite
from simrig.ledger.unchecked import BATCH_STAGES, UNCHECKED, VALUE_CHECKED, lookup

BEGIN, END = "<!-- decisions:begin -->", "<!-- decisions:end -->"


@dataclass(frozen=True)
class DecisionPath:
    name: str
    stages: tuple[str, ...]
    what: str
    only: frozenset[str] | None = None  # the fields this path decides differently (None: all)


# The values a spec-decode step decides differently from a plain step: drafts widen the
# logits, the verification rows, the sampled counts and the uniform query length.
_DRAFT_FIELDS = frozenset({
    "num_draft_tokens_np", "num_draft_tokens", "num_draft_tokens_per_req", "expanded_idx_mapping",
    "expanded_local_pos", "cu_num_logits", "cu_num_logits_np", "logits_indices",
    "num_scheduled_tokens", "uniform_decode_token_count", "uniform_token_count", "max_query_len",
    "prefill_runs_as_decode_np", "decode_graph_eligible", "num_admitted_draft_tokens", "req_ids",
    "num_sampled", "num_rejected", "output.num_sampled_tokens", "output.sampled_token_ids",
    "sampled_tokens", "post.last_sampled_tokens", "post.num_computed_tokens", "lora.token_mapping"})

PATHS: tuple[DecisionPath, ...] = (
    DecisionPath("real step", ("lifecycle", "gather", "dispatch", "prepare", "postprocess"),
                 "execute_model on a scheduler output: state updates, the dispatch, the global batch, "
                 "the sampled output"),
    DecisionPath("spec-decode step", ("gather", "dispatch", "prepare", "postprocess"),
                 "the same with drafts scheduled: the values drafts change", _DRAFT_FIELDS),
    DecisionPath("PCP rank", ("partition",),
                 "each PCP rank's (and DCP peer's) rank-local batch, partitioned from the global one"),
    DecisionPath("non-last PP rank", ("pipeline",),
                 "with pp_size > 1: a non-last pipeline rank's execute_model and sample_tokens on the "
                 "same scheduler output (the broadcast it receives, its request state), beside the last "
                 "rank's"),
    DecisionPath("idle DP dummy", ("dummy",),
                 "_dummy_run after each step at its token count (unless the step says idle_dummy "
                 "false): what an idle data-parallel rank runs"),
    DecisionPath("profile run", ("profile",),
                 "profile_run at start-up: the whole token budget, every token real, attention skipped"),
    DecisionPath("micro-batch split", ("ubatch",),
                 "DBO (num_ubatches > 1): vLLM's split decision for the step, and each micro-batch "
                 "of the batch the forward ran (create_ubatch_slices, _slice_input_batch)"),
    DecisionPath("capture dummy", ("capture",),
                 "capture_model: one dummy per captured descriptor (FULL and PIECEWISE, every capture "
                 "size, every LoRA case, uniform and mixed), each judged on its own"),
)

_TO_MODEL = ("input_ids", "positions")
_TO_ATTN = ("query_start_loc", "query_start_loc_np", "seq_lens", "seq_lens_cpu_upper_bound",
            "max_query_len", "num_computed_tokens_np", "dcp_local_seq_lens", "is_prefilling_np",
            "prefill_len_np", "num_computed_prefill_tokens_np", "has_prefill", "decode_graph_eligible",
            "prefill_runs_as_decode_np", "prompt_lens", "max_seq_len_np", "fast_prefill")
_TO_SAMPLER = ("logits_indices", "cu_num_logits", "cu_num_logits_np", "expanded_idx_mapping",
               "expanded_local_pos", "idx_mapping", "idx_mapping_np", "num_draft_tokens",
               "num_draft_tokens_per_req", "num_draft_tokens_np", "num_admitted_draft_tokens",
               "has_structured_output_reqs", "req_ids")
_TO_REPLAY = ("num_tokens", "num_tokens_after_padding", "num_reqs", "num_reqs_after_padding",
              "cg_mode", "uniform_token_count", "num_active_loras", "capture_sizes",
              "uniform_decode_token_count")

# what the sampling oracle judges (its own observation, StepObs.sampled): where each goes next
_AFTER_SAMPLING = {"sampler.processed_logits": "the sampler's token draw",
                   "sampler.grammar_mask": "the sampler's token draw",
                   "sampler.grammar_token": "postprocess_sampled and the scheduler",
                   "sampler.sampled_token": "postprocess_sampled and the scheduler",
                   "req_states.all_token_ids": "the runner's request state (penalties, bad words, drafters)"}


def consumer(stage: str, name: str) -> str:
    """Where the value goes next."""
    if stage == "lifecycle":
        return "the runner's request state"
    if stage == "postprocess":
        return _AFTER_SAMPLING.get(name, "the scheduler (ModelRunnerOutput)")
    if stage == "pipeline":
        return "the non-last PP rank's request state (its next steps' inputs)"
    if stage == "ubatch":
        return "a micro-batch's attention metadata and forward" if name != "desc.num_ubatches" \
            else "the micro-batch runner"
    if name == "uniform_decode":
        return "the micro-batch split (its threshold)"
    if name == "is_padding":
        return "the forward context (MoE routing)"
    if name.startswith(("pcp.", "manager.")) or name == "pcp":
        return "the other PCP ranks (gather, restore)"
    if name.startswith("attn."):
        return "the attention metadata builders"
    if name.startswith("lora."):
        return "the LoRA manager (_set_active_loras)"
    if name.startswith("desc.") or name in _TO_REPLAY:
        return "the graph dispatch and replay"
    if name in _TO_MODEL:
        return "the model forward"
    if name in _TO_ATTN:
        return "the attention metadata builders"
    if name in _TO_SAMPLER:
        return "the sampler"
    return "prepare_inputs" if stage == "gather" else "the batch"


def stage_fields(stage: str) -> list[str]:
    """Every field the tables name for ``stage`` ("*" entries for every batch stage)."""
    names = {f for table in (VALUE_CHECKED, UNCHECKED) for s, f in table if s == stage
             or (s == "*" and stage in BATCH_STAGES)}
    return sorted(names)


@dataclass(frozen=True)
class Decision:
    path: str
    stage: str
    field: str
    goes_to: str
    check: str | None  # the check that judges it (VALUE_CHECKED), or None
    reason: str | None  # why not, when not judged
    evidence: tuple[Cite, ...] = ()

    @property
    def judged(self) -> bool:
        return self.check is not None


def _evidence(stage: str, name: str) -> tuple[Cite, ...]:
    entry = REASONS.get((stage, name)) or REASONS.get(("*", name))
    return entry[1] if entry else ()


def decisions() -> list[Decision]:
    rows = []
    for path in PATHS:
        for stage in path.stages:
            for name in stage_fields(stage):
                if path.only is not None and name not in path.only:
                    continue
                check = lookup(VALUE_CHECKED, stage, name)
                reason = None if check else lookup(UNCHECKED, stage, name)
                rows.append(Decision(path.name, stage, name, consumer(stage, name), check, reason,
                                     () if check else _evidence(stage, name)))
    return rows


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def decisions_table() -> str:
    """docs/decisions.md's generated part: a count, the paths, then one row per decision."""
    rows = decisions()
    judged = sum(r.judged for r in rows)
    out = [f"{len(rows)} decisions: {judged} judged by a check, {len(rows) - judged} not judged, "
           "each with the vLLM line that says why.", "",
           "| path | stages | what it is |", "|---|---|---|"]
    out += [f"| {p.name} | {', '.join(p.stages)} | {_cell(p.what)} |" for p in PATHS]
    out += ["", "| path | stage | field | goes to | judged by | or not judged, because (evidence) |",
            "|---|---|---|---|---|---|"]
    for r in rows:
        why = ""
        if not r.judged:
            why = f"{r.reason or 'NO REASON'} — " + "; ".join(c.where() for c in r.evidence) \
                if r.evidence else f"{r.reason or 'NO REASON'} — NO EVIDENCE"
        out.append(f"| {r.path} | {r.stage} | `{r.field}` | {r.goes_to} | {_cell(r.check or '')} "
                   f"| {_cell(why)} |")
    return "\n".join(out)


def page_section(text: str) -> str:
    """The generated part of a page: between BEGIN and END."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")

CALL_BEGIN, CALL_END = "<!-- call-sites:begin -->", "<!-- call-sites:end -->"


def call_sites_table() -> str:
    """docs/decisions.md's second generated part: every call site's arguments and their verdicts."""
    judged_rows = sum(row.judged for row in ROWS.values())
    out = [f"{len(ROWS)} arguments at {len(SITES)} call sites: {judged_rows} judged through the decisions "
           f"above, {len(ROWS) - judged_rows} not judged, each with the line that says why.", "",
           "| receiver | called in | argument | judged through | or not judged, because (evidence) |",
           "|---|---|---|---|---|"]
    for site in SITES:
        for (name, key), row in ROWS.items():
            if name != site.name:
                continue
            why = "" if row.judged else f"{row.reason} — " + "; ".join(c.where() for c in row.evidence)
            out.append(f"| {site.name} | `{site.caller}` | `{_cell(key)}` | "
                       f"{', '.join(f'`{d}`' for d in row.judged_by)} | {_cell(why)} |")
    return "\n".join(out)


def regenerate_page(page: Path) -> None:
    """Rewrite both generated parts of docs/decisions.md (``python -m simrig.ledger.decisions``)."""
    text = page.read_text(encoding="utf-8")
    for begin, end, body in ((BEGIN, END, decisions_table()),
                             (CALL_BEGIN, CALL_END, call_sites_table())):
        head, rest = text.split(begin, 1)
        text = f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}"
    page.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    regenerate_page(RIG / "docs" / "decisions.md")
