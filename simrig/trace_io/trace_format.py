"""Trace format v1, line by line: the data model and the parsing of one line.

``parse_header`` turns line 1 into a ``TraceHeader``, ``parse_step`` a later
line into a ``Step``; each malformed field raises ``TraceError`` whose text is
``FILE:LINE: field: problem``. Reading a file (decompression, text, cross-step
identity checks) is ``simrig.trace_io.trace``; writing one is
``simrig.trace_io.trace_writer``. The full specification is traces/README.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from simrig.sampling.params import SamplingSpec, SamplingSpecError
from simrig.step import (KV_GROUP_KINDS, SYNTH_VOCAB_SIZE, BlockIds, CachedUpdate, KvGroup, NewRequest,
                         RunnerConfig, Step)
from simrig.trace_io.grammar_field import parse_grammar, parse_structured

FORMAT_NAME = "simrig-trace"
FORMAT_VERSION = 1
SOURCE_KINDS = ("recorded", "imported", "generated", "hand-written", "shrunk")


class TraceError(ValueError):
    """A malformed trace: one line naming file, line and field (characters that
    would break or colour the line escaped, a long field or problem shortened)."""

    def __init__(self, path: str, line: int, field_name: str, problem: str):
        self.path, self.line, self.field, self.problem = path, line, field_name, problem
        super().__init__(f"{_one_line(path, 400)}:{line}: {_one_line(field_name, 200)}: "
                         f"{_one_line(problem, 400)}")


def _one_line(text: str, limit: int) -> str:
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


@dataclass(frozen=True)
class Expectation:
    """A finding class the trace must produce (header ``expect``), e.g. a
    regression trace's loud KeyError: ``{"kind": "key_error", "stage":
    "lifecycle", "exception_type": "KeyError", "step": 1, "req_ids": ["ghost1"]}``.

    Only ``kind`` is required; every other key given must match. A finding
    matching it is reported *expected*; an expectation nothing matched is a
    new finding (the trace no longer shows what it was kept for).
    """

    kind: str
    stage: str | None = None
    field: str | None = None
    exception_type: str | None = None
    step: int | None = None
    req_ids: tuple[str, ...] = ()  # each must be among the finding's request ids
    note: str = ""  # why this is expected (free text)

    def matches(self, finding: Any) -> bool:
        """``finding``: anything with kind, stage, field, exception_type, step, req_ids."""
        if finding.kind != self.kind:
            return False
        for name in ("stage", "field", "exception_type", "step"):
            want = getattr(self, name)
            if want is not None and getattr(finding, name) != want:
                return False
        return set(self.req_ids) <= set(finding.req_ids)

    def describe(self) -> str:
        """'key_error at step 1 lifecycle naming ghost1 (KeyError)'."""
        text = self.kind
        if self.step is not None:
            text += f" at step {self.step}"
        if self.stage:
            text += f" {self.stage}" if self.step is not None else f" in {self.stage}"
        if self.field:
            text += f" field {self.field}"
        if self.req_ids:
            text += f" naming {','.join(self.req_ids)}"
        if self.exception_type:
            text += f" ({self.exception_type})"
        return text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for name in ("stage", "field", "exception_type", "step"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.req_ids:
            out["req_ids"] = list(self.req_ids)
        if self.note:
            out["note"] = self.note
        return out


_EXPECT_KEYS = {"kind", "stage", "field", "exception_type", "step", "req_ids", "note"}


def parse_expectations(raw: Any, ln: _Line) -> tuple[Expectation, ...]:
    if not isinstance(raw, list):
        raise ln.fail("expect", f"must be a list, got {type(raw).__name__}")
    out = []
    for name, item in ln.objects(raw, "expect", _EXPECT_KEYS):
        values: dict[str, Any] = {"kind": ln.str_(item, "kind", f"{name}.kind")}
        for key in ("stage", "field", "exception_type", "note"):
            if key in item:
                if not isinstance(item[key], str):
                    raise ln.fail(f"{name}.{key}", f"must be a string, got {item[key]!r}")
                values[key] = item[key]
        if "step" in item:
            values["step"] = ln.int_(item, "step", f"{name}.step")
        if "req_ids" in item:
            values["req_ids"] = tuple(ln.id_list(item, "req_ids", f"{name}.req_ids"))
        out.append(Expectation(**values))
    return tuple(out)


@dataclass
class TraceHeader:
    config: RunnerConfig = field(default_factory=RunnerConfig)
    source: dict[str, Any] = field(default_factory=lambda: {"kind": "generated"})
    # Adversarial traces break the scheduler contract on purpose (duplicate new
    # ids, cached updates for unknown ids); strict validation lets them through
    # so the runner can be checked for failing loudly.
    adversarial: bool = False
    # Finding classes the trace must produce (a regression suite's assertions).
    expect: tuple[Expectation, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {"format": FORMAT_NAME, "version": FORMAT_VERSION,
               "config": config_to_json(self.config), "source": self.source,
               "adversarial": self.adversarial}
        if self.expect:
            out["expect"] = [e.to_json() for e in self.expect]
        return out


# ------------------------------------------------------------- one line
class _Line:
    """Field access on one parsed line that fails with FILE:LINE: field: problem."""

    def __init__(self, path: str, line: int):
        self.path, self.line = path, line

    def fail(self, name: str, problem: str) -> TraceError:
        return TraceError(self.path, self.line, name, problem)

    def int_(self, obj: dict, key: str, name: str, *, default: Any = ..., minimum: int = 0) -> Any:
        if key not in obj:
            if default is ...:
                raise self.fail(name, "missing")
            return default
        value = obj[key]
        if value is None and default is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(name, f"must be an integer, got {type(value).__name__} {value!r}")
        if value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        return value

    def str_(self, obj: dict, key: str, name: str) -> str:
        value = obj.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(name, f"must be a non-empty string, got {value!r}")
        return value

    def list_(self, obj: dict, key: str, name: str) -> list:
        value = obj.get(key, [])
        if not isinstance(value, list):
            raise self.fail(name, f"must be a list, got {type(value).__name__}")
        return value

    def dict_(self, obj: dict, key: str, name: str) -> dict:
        value = obj.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(name, f"must be an object, got {type(value).__name__}")
        return value

    def objects(self, items: list, prefix: str, keys: set[str]) -> Iterator[tuple[str, dict]]:
        """``(f"{prefix}[i]", item)`` for each item of a list of objects whose
        fields are all in ``keys``."""
        for i, item in enumerate(items):
            name = f"{prefix}[{i}]"
            if not isinstance(item, dict):
                raise self.fail(name, "must be an object")
            unknown = set(item) - keys
            if unknown:
                raise self.fail(f"{name}.{min(unknown)}", "unknown field")
            yield name, item

    def int_list(self, value: Any, name: str) -> list[int]:
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise self.fail(name, "must be a list of non-negative integers")
        return value

    def block_ids(self, value: Any, name: str) -> BlockIds:
        """One list of block ids (one-group traces) or one list per KV cache group."""
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            return [self.int_list(group, f"{name}[{g}]") for g, group in enumerate(value)]
        if isinstance(value, list) and any(isinstance(v, list) for v in value):
            raise self.fail(name, "must be a list of integers or a list of lists, not a mix")
        return self.int_list(value, name)

    def id_map(self, obj: dict, key: str, name: str, minimum: int) -> dict[str, int]:
        raw = self.dict_(obj, key, name)
        if "" in raw:
            raise self.fail(name, "a request id must be a non-empty string, got ''")
        return {req_id: self.int_(raw, req_id, f"{name}.{req_id}", minimum=minimum)
                for req_id in raw}

    def id_list(self, obj: dict, key: str, name: str) -> list[str]:
        raw = self.list_(obj, key, name)
        for i, v in enumerate(raw):
            if not isinstance(v, str) or not v:
                raise self.fail(f"{name}[{i}]", f"must be a non-empty string, got {v!r}")
        return raw


_STEP_KEYS = {"step", "new_requests", "cached_requests", "num_scheduled_tokens",
              "spec_tokens", "rejected", "finished", "preempted", "idle_dummy", "grammar"}


# Graph fields are written only when set, so eager traces read as before.
_GRAPH_DEFAULTS = {"cudagraph_mode": "NONE", "capture_sizes": [], "varlen_decode": False}
# LoRA fields likewise: traces without adapters read and write as before.
_LORA_DEFAULTS = {"max_loras": 0, "specialize_active_lora": False, "cudagraph_specialize_lora": True}
# The rejection sampler likewise: written only when vLLM's own runs.
_SAMPLER_DEFAULTS = {"rejection_sampler": ""}
# Micro-batch fields likewise: written only when micro-batching is on or the
# thresholds are not vLLM's defaults.
_UBATCH_DEFAULTS = {"num_ubatches": 1, "dbo_decode_token_threshold": 32, "dbo_prefill_token_threshold": 512}
_BOOL_CONFIG_KEYS = ("shard_decode_requests", "varlen_decode", "specialize_active_lora",
                     "cudagraph_specialize_lora")


def config_to_json(config: RunnerConfig) -> dict[str, Any]:
    out = asdict(config)
    out["capture_sizes"] = list(config.capture_sizes)
    out["kv_groups"] = [_kv_group_to_json(g) for g in config.kv_groups]
    if config.kv_groups == (KvGroup(),):  # one full group: traces read as before
        del out["kv_groups"]
    omitted = {**_GRAPH_DEFAULTS, **_LORA_DEFAULTS, **_SAMPLER_DEFAULTS, **_UBATCH_DEFAULTS,
               "pp_size": 1}  # no PP: traces read as before
    return {k: v for k, v in out.items() if omitted.get(k, ...) != v}


def _kv_group_to_json(group: KvGroup) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": group.kind}
    if group.window:
        out["window"] = group.window
    if group.block_size:
        out["block_size"] = group.block_size
    return out


def parse_kv_groups(raw: Any, ln: _Line) -> tuple[KvGroup, ...]:
    """config.kv_groups: [{"kind": "full"}, {"kind": "sliding_window", "window": 8,
    "block_size": 4}, ...]; value rules beyond the types are RunnerConfig.validate's."""
    if not isinstance(raw, list) or not raw:
        raise ln.fail("config.kv_groups", f"must be a non-empty list of groups, got {raw!r}")
    groups = []
    for name, item in ln.objects(raw, "config.kv_groups", {"kind", "window", "block_size"}):
        kind = item.get("kind", "full")
        if kind not in KV_GROUP_KINDS:
            raise ln.fail(f"{name}.kind", f"must be one of {', '.join(KV_GROUP_KINDS)}, got {kind!r}")
        groups.append(KvGroup(kind=kind, window=ln.int_(item, "window", f"{name}.window", default=0),
                              block_size=ln.int_(item, "block_size", f"{name}.block_size", default=0,
                                                 minimum=1)))
    return tuple(groups)


def parse_header(obj: Any, path: str) -> TraceHeader:
    ln = _Line(path, 1)
    if not isinstance(obj, dict):
        raise ln.fail("header", "must be a JSON object")
    if obj.get("format") != FORMAT_NAME:
        raise ln.fail("format", f"expected {FORMAT_NAME!r}, got {obj.get('format')!r}")
    version = obj.get("version")
    if version != FORMAT_VERSION:
        raise ln.fail("version", f"unsupported trace version {version!r} (this simrig reads {FORMAT_VERSION})")
    raw_config = ln.dict_(obj, "config", "config")
    known = {f.name: f for f in fields(RunnerConfig)}
    values: dict[str, Any] = {}
    for key, value in raw_config.items():
        if key not in known:
            raise ln.fail(f"config.{key}", "unknown field")
        if key in _BOOL_CONFIG_KEYS:
            if not isinstance(value, bool):
                raise ln.fail(f"config.{key}", f"must be true or false, got {value!r}")
            values[key] = value
        elif key in ("cudagraph_mode", "rejection_sampler"):
            if not isinstance(value, str):
                raise ln.fail(f"config.{key}", f"must be a mode name, got {value!r}")
            values[key] = value
        elif key == "capture_sizes":
            values[key] = tuple(ln.int_list(value, f"config.{key}"))
        elif key == "kv_groups":
            values[key] = parse_kv_groups(value, ln)
        else:
            values[key] = ln.int_(raw_config, key, f"config.{key}")
    config = RunnerConfig(**values)
    try:
        config.validate()
    except ValueError as exc:
        name, _, problem = str(exc).partition(": ")
        raise ln.fail(f"config.{name}", problem) from None
    source = ln.dict_(obj, "source", "source")
    kind = source.get("kind", "generated")
    if kind not in SOURCE_KINDS:
        raise ln.fail("source.kind", f"must be one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
    adversarial = obj.get("adversarial", False)
    if not isinstance(adversarial, bool):
        raise ln.fail("adversarial", f"must be true or false, got {adversarial!r}")
    expect = parse_expectations(obj["expect"], ln) if "expect" in obj else ()
    return TraceHeader(config=config, source=dict(source), adversarial=adversarial, expect=expect)


def parse_step(obj: Any, path: str, line: int) -> Step:
    ln = _Line(path, line)
    if not isinstance(obj, dict):
        raise ln.fail("step", "must be a JSON object")
    unknown = set(obj) - _STEP_KEYS
    if unknown:
        raise ln.fail(sorted(unknown)[0], "unknown field")
    new = []
    for i, raw in enumerate(ln.list_(obj, "new_requests", "new_requests")):
        name = f"new_requests[{i}]"
        if not isinstance(raw, dict):
            raise ln.fail(name, "must be an object")
        req_id = ln.str_(raw, "id", f"{name}.id")
        prompt_len = ln.int_(raw, "prompt_len", f"{name}.prompt_len", minimum=1)
        prefill_len = ln.int_(raw, "prefill_len", f"{name}.prefill_len", default=None, minimum=1)
        token_ids = raw.get("token_ids")
        if token_ids is not None:
            ln.int_list(token_ids, f"{name}.token_ids")
            if len(token_ids) != prompt_len:
                raise ln.fail(f"{name}.token_ids", f"has {len(token_ids)} ids, prompt_len is {prompt_len}")
        if prefill_len is not None and prefill_len < prompt_len:
            raise ln.fail(f"{name}.prefill_len", f"{prefill_len} < prompt_len {prompt_len}")
        streaming = raw.get("streaming", False)
        if not isinstance(streaming, bool):
            raise ln.fail(f"{name}.streaming", f"must be true or false, got {streaming!r}")
        num_computed = ln.int_(raw, "num_computed_tokens", f"{name}.num_computed_tokens", default=0)
        if num_computed > (prefill_len or prompt_len):
            raise ln.fail(f"{name}.num_computed_tokens", f"{num_computed} exceeds the prefill length")
        max_tokens = ln.int_(raw, "max_tokens", f"{name}.max_tokens", default=16, minimum=1)
        try:  # token ids within the vocabulary the runner's stand-in logits span
            sampling = None if raw.get("sampling") is None else SamplingSpec.from_json(
                raw["sampling"], where=f"{name}.sampling", vocab_size=SYNTH_VOCAB_SIZE, max_tokens=max_tokens)
        except SamplingSpecError as exc:
            raise ln.fail(exc.field, exc.problem) from None
        new.append(NewRequest(
            req_id=req_id, prompt_len=prompt_len, num_computed_tokens=num_computed, max_tokens=max_tokens,
            prefill_len=prefill_len, prompt_token_ids=token_ids,
            block_ids=ln.block_ids(raw.get("block_ids", []), f"{name}.block_ids"),
            # LoRARequest: "id must be > 0"
            lora_id=ln.int_(raw, "lora_id", f"{name}.lora_id", default=None, minimum=1),
            streaming=streaming, sampling=sampling, structured_output=parse_structured(raw, name, ln)))
    cached = []
    for i, raw in enumerate(ln.list_(obj, "cached_requests", "cached_requests")):
        name = f"cached_requests[{i}]"
        if not isinstance(raw, dict):
            raise ln.fail(name, "must be an object")
        blocks = raw.get("new_block_ids")
        resumed = raw.get("resumed", False)
        if not isinstance(resumed, bool):
            raise ln.fail(f"{name}.resumed", f"must be true or false, got {resumed!r}")
        cached.append(CachedUpdate(
            req_id=ln.str_(raw, "id", f"{name}.id"),
            num_computed_tokens=ln.int_(raw, "num_computed_tokens", f"{name}.num_computed_tokens"),
            new_block_ids=None if blocks is None else ln.block_ids(blocks, f"{name}.new_block_ids"),
            resumed=resumed))
    scheduled = ln.id_map(obj, "num_scheduled_tokens", "num_scheduled_tokens", minimum=1)
    spec = ln.id_map(obj, "spec_tokens", "spec_tokens", minimum=0)
    rejected = ln.id_map(obj, "rejected", "rejected", minimum=0)
    for req_id, k in spec.items():
        if req_id not in scheduled:
            raise ln.fail(f"spec_tokens.{req_id}", "request is not scheduled in this step")
        if k >= scheduled[req_id]:
            raise ln.fail(f"spec_tokens.{req_id}",
                          f"{k} drafts need more than {scheduled[req_id]} scheduled tokens")
    for req_id, r in rejected.items():
        if r > spec.get(req_id, 0):
            raise ln.fail(f"rejected.{req_id}", f"{r} rejected exceeds {spec.get(req_id, 0)} drafts")
    idle_dummy = obj.get("idle_dummy", True)
    if not isinstance(idle_dummy, bool):
        raise ln.fail("idle_dummy", f"must be true or false, got {idle_dummy!r}")
    return Step(new_requests=new, cached=cached, num_scheduled_tokens=scheduled,
                spec_tokens={k: v for k, v in spec.items() if v}, rejected=rejected,
                finished=ln.id_list(obj, "finished", "finished"),
                preempted=ln.id_list(obj, "preempted", "preempted"), idle_dummy=idle_dummy,
                grammar=parse_grammar(obj, ln, scheduled))
