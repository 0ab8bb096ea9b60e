"""Workloads: who arrives when, with how many prompt and output tokens.

A workload is a list of ``WorkloadRequest`` sorted by arrival time, vLLM-agnostic;
``simrig.sources.record`` feeds it to the real scheduler. ``parse_spec`` reads
``simrig record --workload SPEC`` (synthetic, or an Azure, BurstGPT or Mooncake file);
shared-prefix tokens (``prefix_token``) are identical across the requests that share
them, so vLLM's prefix cache hits; ``clamp`` cuts requests to the model length;
``assign_sampling`` gives each request the sampling parameters of a fixed mix.

See docs/recording.md, 'Importing public workloads'.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from simrig.errors import UsageError
from simrig.sampling.params import SamplingSpec
from simrig.step import synth_token

FILE_FORMATS = ("azure", "burstgpt", "mooncake")
MOONCAKE_BLOCK = 512  # tokens per Mooncake hash id


@dataclass
class WorkloadRequest:
    req_id: str
    arrival_s: float
    prompt_len: int
    max_tokens: int
    # Explicit prompt ids (shared prefixes); None -> synth_token(req_id, p).
    prompt_token_ids: list[int] | None = None
    # Its LoRA adapter (an id >= 1); None: the base model.
    lora_id: int | None = None
    # Its sampling parameters; None: vLLM's defaults.
    sampling: SamplingSpec | None = None

    def token_ids(self) -> list[int]:
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        return [synth_token(self.req_id, p) for p in range(self.prompt_len)]


def prefix_token(key: str, position: int) -> int:
    """A shared-prefix token (synthetic prefixes, Mooncake hash_ids): identical across the
    requests that share the prefix, so vLLM's prefix cache hits; those requests carry
    explicit token ids (``prompt_token_ids``) into the trace. A request's own tokens are
    ``synth_token(req_id, position)``."""
    return synth_token(f"#prefix:{key}", position)


# ----------------------------------------------------------------- synthetic
_SYNTH_DEFAULTS = {"requests": "64", "rate": "0", "prompt": "16-256", "output": "4-64",
                   "shared_prefix": "0", "prefixes": "4", "prefix_len": "64", "seed": "0"}


def _range(spec: str, key: str, value: str) -> tuple[int, int]:
    lo, sep, hi = value.partition("-")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise UsageError(f"workload {spec!r}: {key}: expected N or LO-HI, got {value!r}") from None
    if a < 1 or b < a:
        raise UsageError(f"workload {spec!r}: {key}: need 1 <= LO <= HI, got {value!r}")
    return a, b


def _number(spec: str, key: str, value: str, kind: type, lo: float, hi: float | None = None):
    try:
        x = kind(value)
    except ValueError:
        raise UsageError(f"workload {spec!r}: {key}: expected a {kind.__name__}, got {value!r}") from None
    if x < lo or (hi is not None and x > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise UsageError(f"workload {spec!r}: {key}: must be {bound}, got {value!r}")
    return x


def synthetic(spec: str, body: str, seed: int | None = None) -> list[WorkloadRequest]:
    opts = dict(_SYNTH_DEFAULTS)
    for item in filter(None, body.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _SYNTH_DEFAULTS:
            raise UsageError(f"workload {spec!r}: unknown synthetic key {key!r} "
                             f"(known: {', '.join(_SYNTH_DEFAULTS)})")
        opts[key] = value.strip()
    n = _number(spec, "requests", opts["requests"], int, 1)
    rate = _number(spec, "rate", opts["rate"], float, 0)
    prompt = _range(spec, "prompt", opts["prompt"])
    output = _range(spec, "output", opts["output"])
    share = _number(spec, "shared_prefix", opts["shared_prefix"], float, 0, 1)
    groups = _number(spec, "prefixes", opts["prefixes"], int, 1)
    prefix_len = _number(spec, "prefix_len", opts["prefix_len"], int, 1)
    rng = random.Random(_number(spec, "seed", opts["seed"], int, 0) if seed is None else seed)
    out, t = [], 0.0
    for i in range(n):
        req_id = f"req-{i}"
        plen, olen = rng.randint(*prompt), rng.randint(*output)
        ids = None
        if share > 0 and rng.random() < share:
            g = rng.randrange(groups)
            plen = max(plen, prefix_len + 1)  # the shared part plus an own tail
            ids = ([prefix_token(f"s{g}", p) for p in range(prefix_len)]
                   + [synth_token(req_id, p) for p in range(prefix_len, plen)])
        out.append(WorkloadRequest(req_id, t, plen, olen, ids))
        if rate > 0:
            t += rng.expovariate(rate)
    return out


# --------------------------------------------------------------------- files
def _row_error(path: Path, line: int, field: str, problem: str) -> UsageError:
    return UsageError(f"{path}:{line}: {field}: {problem}")


def _int_field(path: Path, line: int, field: str, value: object, minimum: int = 0) -> int:
    try:
        x = int(str(value).strip())
    except (TypeError, ValueError):
        raise _row_error(path, line, field, f"expected an integer, got {value!r}") from None
    if x < minimum:
        raise _row_error(path, line, field, f"must be >= {minimum}, got {x}")
    return x


def _open(path: Path):
    try:
        return open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}:0: file: {exc.strerror or exc}") from None


def _csv_rows(path: Path, needed: tuple[str, ...], limit: int | None):
    with _open(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise _row_error(path, 1, "header", "empty file")
        names = [h.strip() for h in header]
        missing = [n for n in needed if n not in names]
        if missing:
            raise _row_error(path, 1, "header", f"missing column(s) {', '.join(missing)}; got {names}")
        index = {n: names.index(n) for n in needed}
        count = 0
        for line, row in enumerate(reader, start=2):
            if not row or not any(c.strip() for c in row):
                continue
            if limit is not None and count >= limit:
                return
            if len(row) < len(names):
                raise _row_error(path, line, "row", f"expected {len(names)} columns, got {len(row)}")
            count += 1
            yield line, {n: row[i] for n, i in index.items()}


def _timestamp(path: Path, line: int, field: str, value: str) -> float:
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        # Azure: "2023-11-16 18:15:46.6805900" (7 fractional digits)
        head, dot, frac = value.partition(".")
        return datetime.fromisoformat(head).timestamp() + (float("0." + frac) if dot else 0.0)
    except ValueError:
        raise _row_error(path, line, field, f"not a timestamp: {value!r}") from None


def _finish(raw: list[tuple[float, int, int, list[int] | None]]) -> list[WorkloadRequest]:
    """Sort by time, shift the first arrival to 0, name requests by row order."""
    if not raw:
        return []
    t0 = min(r[0] for r in raw)
    out = [WorkloadRequest(f"req-{i}", t - t0, p, o, ids) for i, (t, p, o, ids) in enumerate(raw)]
    for r in out:
        if r.prompt_token_ids is not None:
            r.prompt_token_ids = [r.prompt_token_ids[p] if p < len(r.prompt_token_ids)
                                  else synth_token(r.req_id, p) for p in range(r.prompt_len)]
    return sorted(out, key=lambda r: r.arrival_s)


def azure(path: Path, limit: int | None = None) -> list[WorkloadRequest]:
    raw = []
    for line, row in _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), limit):
        raw.append((_timestamp(path, line, "TIMESTAMP", row["TIMESTAMP"]),
                    _int_field(path, line, "ContextTokens", row["ContextTokens"], 1),
                    max(_int_field(path, line, "GeneratedTokens", row["GeneratedTokens"]), 1), None))
    return _finish(raw)


def burstgpt(path: Path, limit: int | None = None) -> list[WorkloadRequest]:
    raw = []
    for line, row in _csv_rows(path, ("Timestamp", "Request tokens", "Response tokens"), limit):
        prompt = _int_field(path, line, "Request tokens", row["Request tokens"])
        if prompt == 0:  # BurstGPT logs failed requests with 0 tokens; nothing reaches a runner
            continue
        raw.append((_timestamp(path, line, "Timestamp", row["Timestamp"]), prompt,
                    max(_int_field(path, line, "Response tokens", row["Response tokens"]), 1), None))
    return _finish(raw)


def mooncake(path: Path, limit: int | None = None) -> list[WorkloadRequest]:
    """Mooncake JSONL; hash id h covers tokens [512 i, 512 (i+1)) of the prompt
    and is the same token block in every request that lists it."""
    raw = []
    with _open(path) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            if limit is not None and len(raw) >= limit:
                break
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise _row_error(path, line, "line", f"invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise _row_error(path, line, "line", "must be a JSON object")
            for key in ("timestamp", "input_length", "output_length"):
                if key not in obj:
                    raise _row_error(path, line, key, "missing")
            ts = _int_field(path, line, "timestamp", obj["timestamp"]) / 1000.0
            prompt = _int_field(path, line, "input_length", obj["input_length"], 1)
            output = max(_int_field(path, line, "output_length", obj["output_length"]), 1)
            hashes = obj.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
                raise _row_error(path, line, "hash_ids", "must be a list of integers")
            ids = [prefix_token(f"m{hashes[p // MOONCAKE_BLOCK]}", p % MOONCAKE_BLOCK)
                   for p in range(min(prompt, len(hashes) * MOONCAKE_BLOCK))] if hashes else None
            raw.append((ts, prompt, output, ids))
    return _finish(raw)


READERS = {"azure": azure, "burstgpt": burstgpt, "mooncake": mooncake}


def read_file(fmt: str, path: str | Path, limit: int | None = None) -> list[WorkloadRequest]:
    if fmt not in READERS:
        raise UsageError(f"format: unknown workload format {fmt!r} (choose {', '.join(FILE_FORMATS)})")
    return READERS[fmt](Path(path), limit)


def parse_spec(spec: str, *, seed: int | None = None, limit: int | None = None) -> list[WorkloadRequest]:
    """Parse a workload SPEC (``simrig record --workload SPEC``) into requests::

        synthetic:requests=200,rate=8,prompt=32-512,output=8-128,shared_prefix=0.3
        azure:PATH        Azure LLM inference CSV   TIMESTAMP,ContextTokens,GeneratedTokens
        burstgpt:PATH     BurstGPT CSV              Timestamp,Model,Request tokens,Response tokens,...
        mooncake:PATH     Mooncake JSONL            {"timestamp": ms, "input_length", "output_length",
                                                     "hash_ids"}

    Synthetic keys: requests (count), rate (Poisson arrivals per second; 0 = all at once),
    prompt / output (uniform ranges LO-HI or a single N), shared_prefix (fraction of
    requests that start with one of ``prefixes`` shared prefixes of ``prefix_len``
    tokens), prefixes, prefix_len, seed.
    """
    kind, sep, body = spec.partition(":")
    if not sep:
        raise UsageError(f"workload {spec!r}: expected KIND:..., KIND one of synthetic, "
                         f"{', '.join(FILE_FORMATS)}")
    if kind == "synthetic":
        reqs = synthetic(spec, body, seed)
        return reqs[:limit] if limit is not None else reqs
    if kind in FILE_FORMATS:
        if not body:
            raise UsageError(f"workload {spec!r}: {kind} needs a file path ({kind}:PATH)")
        return read_file(kind, body, limit)
    raise UsageError(f"workload {spec!r}: unknown kind {kind!r} (choose synthetic, {', '.join(FILE_FORMATS)})")


def clamp(reqs: list[WorkloadRequest], max_model_len: int) -> int:
    """Cut requests to the model length in place; returns how many were cut.

    A cut request keeps ``prompt <= max_model_len - 1`` and ``prompt + output <=
    max_model_len``: the prompt is cut first, at least one output token stays."""
    cut = 0
    for r in reqs:
        prompt = min(r.prompt_len, max_model_len - 1)
        output = min(r.max_tokens, max_model_len - prompt)
        if (prompt, output) != (r.prompt_len, r.max_tokens):
            cut += 1
            r.prompt_len, r.max_tokens = prompt, output
            if r.prompt_token_ids is not None:
                r.prompt_token_ids = r.prompt_token_ids[:prompt]
    return cut


def assign_adapters(reqs: list[WorkloadRequest], num_adapters: int, seed: int) -> None:
    """Give each request a LoRA adapter in place, seeded: the base model or one of the
    ids 1 .. num_adapters, each as likely. More adapters than a batch may hold
    (LoRAConfig.max_loras) leaves the scheduler's own limit to act; a request that
    finishes frees a runner slot the next, with another adapter or none, takes."""
    rng = random.Random(f"lora:{seed}")
    for r in reqs:
        pick = rng.randint(0, num_adapters)
        r.lora_id = pick or None


# -------------------------------------------------------------- sampling mixes
_SAMPLED = SamplingSpec(temperature=0.7, top_p=0.95)
_GREEDY = SamplingSpec(temperature=0.0)
# mix -> (percent of requests, spec), the percents summing to 100; docs/recording.md shows them
SAMPLING_MIXES: dict[str, tuple[tuple[int, SamplingSpec | None], ...]] = {
    "none": ((100, None),),
    "chat": ((60, _SAMPLED), (20, _GREEDY),
             (10, SamplingSpec(temperature=0.7, top_p=0.95, repetition_penalty=1.1)),
             (10, SamplingSpec(temperature=0.7, top_p=0.95, logprobs=5))),
    "greedy": ((100, _GREEDY),),
}


def sampling_of(mix: str, req_id: str) -> SamplingSpec | None:
    """The spec ``mix`` gives ``req_id``: the request id's hash picks one of 100 buckets, so
    a request gets the same spec in every run, whatever else the workload holds."""
    bucket = int.from_bytes(hashlib.sha256(f"sampling:{req_id}".encode()).digest()[:8], "big") % 100
    for percent, spec in SAMPLING_MIXES[mix]:
        if bucket < percent:
            return spec
        bucket -= percent
    raise AssertionError(f"the percents of mix {mix!r} sum to less than 100")


def assign_sampling(reqs: list[WorkloadRequest], mix: str) -> None:
    """Give each request its spec from ``mix`` (``SAMPLING_MIXES``) in place; "none" leaves
    every request as it is."""
    if mix not in SAMPLING_MIXES:
        raise UsageError(f"--sampling-mix: unknown mix {mix!r} (choose {', '.join(SAMPLING_MIXES)})")
    if mix != "none":
        for r in reqs:
            r.sampling = sampling_of(mix, r.req_id)
