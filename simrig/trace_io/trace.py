"""Trace format v1: JSON Lines, streamed, optionally gzip or zstd compressed.

This module reads files (``TraceReader``, ``read_trace``); the data model and the parsing
of one line are ``simrig.trace_io.trace_format``, writing is ``simrig.trace_io.trace_writer``
(both re-exported here). Every problem with a file raises ``TraceError`` whose text is the
one line ``FILE:LINE: field: problem``. The full specification is traces/README.md; the
line layout is in ``TraceReader``'s docstring. See docs/trace-format.md.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from simrig.step import RunnerConfig, Step
from simrig.trace_io import bounds
from simrig.trace_io.trace_format import (  # noqa: F401 -- re-exported
    FORMAT_NAME,
    FORMAT_VERSION,
    SOURCE_KINDS,
    Expectation,
    TraceError,
    TraceHeader,
    _Line,
    config_to_json,
    parse_expectations,
    parse_header,
    parse_step,
)
from simrig.trace_io.trace_writer import TraceWriter, step_to_json, write_trace  # noqa: F401

TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")


def trace_files_in(directory: str | os.PathLike[str]) -> list[Path]:
    """The trace files directly inside ``directory``, sorted by name: ``*.jsonl``,
    ``*.jsonl.gz``, ``*.jsonl.zst``. Names starting with ``.`` are skipped: a
    ``.tmp-*NAME.jsonl`` is a TraceWriter's unfinished file (left behind when its
    process was killed), never a trace."""
    return sorted(p for p in Path(directory).iterdir()
                  if not p.name.startswith(".") and p.name.endswith(TRACE_SUFFIXES) and p.is_file())


# ----------------------------------------------------------------- open files
class _ZstdReader(io.RawIOBase):
    """Decompresses zstd frames; input that ends inside a frame raises EOFError
    (zstandard's own stream reader just stops there, silently)."""

    def __init__(self, raw: IO[bytes]):
        import zstandard  # cold path: keeps zstandard off simrig --help

        self._raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self._frame: Any = None  # the frame being decompressed; None between frames
        self._out, self._pos = b"", 0  # decompressed, not yet handed out from _pos on

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._pos == len(self._out):
            # 1 KiB in gives at most ~32 MB out (zstd's RLE blocks: 4 bytes -> 128 KiB)
            chunk = self._raw.read(1 << 10)
            if not chunk:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("compressed file ended before the end of its last zstd frame")
                return 0
            parts = []
            while chunk:
                if self._frame is None or self._frame.eof:
                    self._frame = self._new()
                parts.append(self._frame.decompress(chunk))
                chunk = self._frame.unused_data if self._frame.eof else b""
            self._out, self._pos = b"".join(parts), 0
        n = min(len(buffer), len(self._out) - self._pos)
        buffer[:n] = memoryview(self._out)[self._pos:self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def _open_binary(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.endswith(".zst"):
        raw = open(path, "rb")  # noqa: SIM115 -- the reader owns it and closes it
        try:
            return io.BufferedReader(_ZstdReader(raw), 1 << 16)
        except BaseException:
            raw.close()
            raise
    return open(path, "rb")


# -------------------------------------------------------------------- reading
class _LiveIds:
    """Strict validation of request identity across steps.

    A new request must not already be held (unless it finishes or is preempted
    in the same step, which the runner applies first), except a streaming-input
    update, which must be (``streaming``: vLLM re-sends a resumable request the
    runner still holds with its next input); a cached update must
    name a held request. Scheduling an id the runner never received is *not*
    rejected here: that is the scheduler-contract check's job, so the runner's
    own reaction (a KeyError) is observed and reported. Sizes (lengths, block
    ids, counts against the config) are ``bounds.StepBounds``'s, for every trace.
    """

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.live: set[str] = set()
        self.adapter: dict[str, int] = {}  # live request id -> its LoRA adapter id

    def apply(self, step: Step, ln: _Line) -> None:
        self.live.difference_update(step.finished)
        self.live.difference_update(step.preempted)
        seen = set()
        for i, req in enumerate(step.new_requests):
            if req.req_id in seen or (req.req_id in self.live and not req.streaming):
                raise ln.fail(f"new_requests[{i}].id", f"duplicate new request id {req.req_id!r}")
            if req.streaming and req.req_id not in self.live:
                raise ln.fail(f"new_requests[{i}].streaming", f"a streaming update of {req.req_id!r}, "
                              "which the runner does not hold")
            if req.lora_id is not None and self.config.max_loras == 0:
                raise ln.fail(f"new_requests[{i}].lora_id", "LoRA is off (config.max_loras is 0)")
            seen.add(req.req_id)
        self.live |= seen
        self._check_adapters(step, ln)
        for i, upd in enumerate(step.cached):
            if upd.req_id not in self.live:
                raise ln.fail(f"cached_requests[{i}].id", f"unknown cached request id {upd.req_id!r}")
        limit = self.config.num_speculative_tokens
        for req_id, k in step.spec_tokens.items():
            if k > limit:
                raise ln.fail(f"spec_tokens.{req_id}", f"{k} drafts exceed num_speculative_tokens {limit}")

    def _check_adapters(self, step: Step, ln: _Line) -> None:
        """A step's batch holds at most max_loras adapters (LoRAConfig.max_loras:
        "Max number of LoRAs in a single batch"; vLLM's scheduler keeps to it)."""
        for gone in (*step.finished, *step.preempted):
            self.adapter.pop(gone, None)
        self.adapter.update({r.req_id: r.lora_id for r in step.new_requests if r.lora_id is not None})
        active = {self.adapter[r] for r in step.num_scheduled_tokens if r in self.adapter}
        if len(active) > self.config.max_loras:
            raise ln.fail("num_scheduled_tokens", f"the batch holds {len(active)} LoRA adapters "
                          f"{sorted(active)}, config.max_loras is {self.config.max_loras}")


class TraceReader:
    """Streams a trace: ``header`` is read on open, steps on iteration.

    The file is read as bytes, one line at a time, and each line decoded on its
    own, so every problem names the line it is on.

        line 1   {"format": "simrig-trace", "version": 1, "config": {...}, "source": {...}}
        line 2+  {"step": 0, "new_requests": [...], "cached_requests": [...],
                  "num_scheduled_tokens": {...}, "spec_tokens": {...}, "rejected": {...},
                  "finished": [...], "preempted": [...]}

    The full specification is traces/README.md. This module reads files; the data
    model and the parsing of one line are ``simrig.trace_io.trace_format``, writing
    is ``simrig.trace_io.trace_writer`` (both re-exported here, so
    ``from simrig.trace_io.trace import TraceHeader, TraceWriter`` keeps working).

    Every problem with a file -- a malformed line, bytes that are not UTF-8, a
    compressed stream cut short, a read error -- raises ``TraceError`` whose text is
    the one line ``FILE:LINE: field: problem`` (field ``file`` for the file itself).
    """

    def __init__(self, path: str | os.PathLike[str], *, validate: bool = True):
        self.path = Path(path)
        self.name = str(path)
        self.validate = validate
        self._compressed = self.path.name.endswith((".gz", ".zst"))
        self._line = 0  # lines read so far
        self._max_line = bounds.HEADER_LINE_BYTES  # then the config's bounds.max_line_bytes
        try:
            self._file = _open_binary(self.path)
        except OSError as exc:
            raise TraceError(self.name, 0, "file", exc.strerror or str(exc)) from None
        try:
            first = next(self._lines(), (1, ""))[1]
            if not first.strip():
                raise TraceError(self.name, 1, "header", "empty file")
            self.header = parse_header(self._load(first, 1, "header"), self.name)
            bounds.check_config(self.header.config, self.name)  # before anything is allocated
            self._max_line = bounds.max_line_bytes(self.header.config)
        except BaseException:
            self._file.close()
            raise

    def _read_error(self, line: int, exc: Exception) -> TraceError:
        if isinstance(exc, EOFError):
            problem = f"truncated: cannot decompress ({exc})"
        elif isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile):
            problem = f"cannot read ({exc.strerror or exc})"
        elif self._compressed:
            problem = f"cannot decompress ({exc})"  # BadGzipFile, zlib.error, ZstdError
        else:
            problem = f"cannot read ({exc})"
        return TraceError(self.name, line, "file", problem)

    def _lines(self) -> Iterator[tuple[int, str]]:
        """(line number, text) of each remaining line."""
        while True:
            try:
                raw = self._file.readline(self._max_line + 1)
            except Exception as exc:  # noqa: BLE001 -- every read error becomes one line
                raise self._read_error(self._line + 1, exc) from None
            if not raw:
                return
            self._line += 1
            if len(raw) > self._max_line and not raw.endswith(b"\n"):
                raise TraceError(self.name, self._line, "file", f"line longer than {self._max_line} bytes "
                                 f"(the most a trace of this config needs)")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(self.name, self._line, "file",
                                 f"not UTF-8 text (invalid byte 0x{raw[exc.start]:02x} "
                                 f"at column {exc.start + 1})") from None
            yield self._line, text

    def _load(self, text: str, line: int, what: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(self.name, line, what, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise TraceError(self.name, line, what, "invalid JSON (nested too deeply)") from None
        except ValueError as exc:  # an integer past Python's digit limit
            raise TraceError(self.name, line, what, f"invalid JSON ({exc})") from None

    def __iter__(self) -> Iterator[tuple[int, Step]]:
        """Yield (line number, Step)."""
        live = _LiveIds(self.header.config) if self.validate and not self.header.adversarial else None
        limits = bounds.StepBounds(self.header.config)  # every trace, adversarial too
        expected_index = 0
        try:
            for line_no, text in self._lines():
                if not text.strip():
                    continue
                obj = self._load(text, line_no, "step")
                step = parse_step(obj, self.name, line_no)
                index = obj.get("step", expected_index)
                if index != expected_index or not isinstance(index, int) or isinstance(index, bool):
                    raise TraceError(self.name, line_no, "step",
                                     f"expected step {expected_index}, got {index!r}")
                expected_index += 1
                limits.apply(step, _Line(self.name, line_no))
                if live is not None:
                    live.apply(step, _Line(self.name, line_no))
                yield line_no, step
        finally:
            self._file.close()

    def close(self) -> None:
        self._file.close()


def read_trace(path: str | os.PathLike[str], *, validate: bool = True) -> tuple[TraceHeader, list[Step]]:
    """Read a whole (small) trace into memory; replay streams instead."""
    reader = TraceReader(path, validate=validate)
    return reader.header, [step for _, step in reader]
