"""Writing trace format v1: a step as JSON, and a streaming writer that
compresses by file name (``.gz``, ``.zst``) and renames into place on close."""

from __future__ import annotations

import gzip
import io
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any

from simrig.step import Step
from simrig.trace_io.trace_format import TraceHeader


def _open_for_writing(path: Path) -> IO[str]:
    name = path.name
    if name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "wb"), encoding="utf-8")
    if name.endswith(".zst"):
        import zstandard  # cold path: keeps zstandard off simrig --help

        stream = zstandard.ZstdCompressor(level=10).stream_writer(open(path, "wb"), closefd=True)
        return io.TextIOWrapper(stream, encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def step_to_json(step: Step, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"step": index}
    if step.finished:
        out["finished"] = list(step.finished)
    if step.preempted:
        out["preempted"] = list(step.preempted)
    if step.new_requests:
        reqs = []
        for r in step.new_requests:
            d: dict[str, Any] = {"id": r.req_id, "prompt_len": r.prompt_len}
            if r.num_computed_tokens:
                d["num_computed_tokens"] = r.num_computed_tokens
            d["max_tokens"] = r.max_tokens
            if r.prefill_len is not None and r.prefill_len != r.prompt_len:
                d["prefill_len"] = r.prefill_len
            if r.prompt_token_ids is not None:
                d["token_ids"] = list(r.prompt_token_ids)
            if r.block_ids:
                d["block_ids"] = list(r.block_ids)
            if r.lora_id is not None:
                d["lora_id"] = r.lora_id
            if r.streaming:
                d["streaming"] = True
            if r.sampling is not None:  # written even when default: {} reads back as asked
                d["sampling"] = r.sampling.to_json()
            if r.structured_output:
                d["structured_output"] = True
            reqs.append(d)
        out["new_requests"] = reqs
    if step.cached:
        cached = []
        for c in step.cached:
            d = {"id": c.req_id, "num_computed_tokens": c.num_computed_tokens}
            if c.new_block_ids is not None:
                d["new_block_ids"] = list(c.new_block_ids)
            if c.resumed:
                d["resumed"] = True
            cached.append(d)
        out["cached_requests"] = cached
    out["num_scheduled_tokens"] = dict(step.num_scheduled_tokens)
    if step.spec_tokens:
        out["spec_tokens"] = dict(step.spec_tokens)
    if step.rejected:
        out["rejected"] = {k: v for k, v in step.rejected.items() if v}
    if not step.idle_dummy:
        out["idle_dummy"] = False
    if step.grammar:  # in the scheduler's order: JSON objects keep theirs
        out["grammar"] = {req_id: list(ids) for req_id, ids in step.grammar.items()}
    return out


class TraceWriter:
    """Streams a trace to a temporary file, renamed into place on close, so
    an interrupted writer never leaves a half-written trace under its name."""

    def __init__(self, path: str | os.PathLike[str], header: TraceHeader):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=self.path.name, dir=self.path.parent)
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a trace is not
        self._tmp = Path(tmp)
        self._file = _open_for_writing(self._tmp)
        self._file.write(json.dumps(header.to_json(), separators=(",", ":")) + "\n")
        self.num_steps = 0

    def write(self, step: Step) -> None:
        self._file.write(json.dumps(step_to_json(step, self.num_steps), separators=(",", ":")) + "\n")
        self.num_steps += 1

    def close(self) -> None:
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_trace(path: str | os.PathLike[str], header: TraceHeader, steps: Any) -> int:
    with TraceWriter(path, header) as writer:
        for step in steps:
            writer.write(step)
    return writer.num_steps
