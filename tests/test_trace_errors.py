"""Every way a trace file can be unreadable gives one line ``PATH:LINE: FIELD: problem``
(no traceback), and directory listing skips dot-files (no vLLM needed)."""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path

import pytest
import zstandard

from simrig.step import NewRequest, Step
from simrig.trace_io.trace import TraceError, TraceHeader, TraceReader, read_trace, trace_files_in, write_trace

STEPS_PER_FILE = 400  # each step line is ~80 bytes: the file is well past 8 KiB


def _steps(n: int) -> list[Step]:
    return [Step(new_requests=[NewRequest(f"r{i}", 4, max_tokens=4)], num_scheduled_tokens={f"r{i}": 4},
                 finished=[f"r{i - 1}"] if i else []) for i in range(n)]


def _lines(tmp_path: Path, n: int = STEPS_PER_FILE) -> list[bytes]:
    """The lines (with newline) of a valid plain trace: header + n steps."""
    path = tmp_path / "valid-source.jsonl"
    write_trace(path, TraceHeader(), _steps(n))
    lines = path.read_bytes().splitlines(keepends=True)
    path.unlink()
    assert len(lines) == n + 1
    return lines


def _bad_byte(line: bytes, column: int) -> bytes:
    """``line`` with byte 0xff at 1-based ``column``."""
    return line[:column - 1] + b"\xff" + line[column:]


def _gzip_cut_after(lines: list[bytes], keep: int) -> bytes:
    """A gzip stream of ``lines`` that stops, without its end marker, right after
    the first ``keep`` lines (a full flush there: those lines decompress whole)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = comp.compress(b"".join(lines[:keep])) + comp.flush(zlib.Z_FULL_FLUSH)
    return data


def _zstd_cut_after(lines: list[bytes], keep: int) -> bytes:
    """A zstd frame of ``lines`` that stops right after the block holding the first ``keep``."""
    buf = io.BytesIO()
    writer = zstandard.ZstdCompressor(level=10).stream_writer(buf, closefd=False)
    writer.write(b"".join(lines[:keep]))
    writer.flush(zstandard.FLUSH_BLOCK)
    head = buf.getvalue()
    writer.write(b"".join(lines[keep:]))
    writer.flush(zstandard.FLUSH_FRAME)
    assert len(buf.getvalue()) > len(head)  # the cut really drops data
    return head


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def _first_half(data: bytes) -> bytes:
    return data[:len(data) // 2]


def _late_utf8(lines: list[bytes]) -> bytes:
    out = list(lines)
    out[149] = _bad_byte(out[149], 12)  # line 150
    assert sum(map(len, out[:149])) > 8192  # past the first 8 KiB that used to be decoded up front
    return b"".join(out)


# name -> (builder of the file's bytes from the valid lines, line, field, problem (exact or prefix…))
CASES = {
    "late_bad_utf8.jsonl": (_late_utf8, 150, "file", "not UTF-8 text (invalid byte 0xff at column 12)"),
    "early_bad_utf8.jsonl": (lambda ls: b"".join([ls[0], _bad_byte(ls[1], 3), *ls[2:]]), 2, "file",
                             "not UTF-8 text (invalid byte 0xff at column 3)"),
    "header_bad_utf8.jsonl": (lambda ls: b"".join([_bad_byte(ls[0], 1), *ls[1:]]), 1, "file",
                              "not UTF-8 text (invalid byte 0xff at column 1)"),
    "late_bad_utf8.jsonl.gz": (lambda ls: gzip.compress(_late_utf8(ls)), 150, "file",
                               "not UTF-8 text (invalid byte 0xff at column 12)"),
    "late_bad_utf8.jsonl.zst": (lambda ls: _zstd(_late_utf8(ls)), 150, "file",
                                "not UTF-8 text (invalid byte 0xff at column 12)"),
    "cut_mid_file.jsonl.gz": (lambda ls: _gzip_cut_after(ls, 120), 121, "file", "truncated: cannot decompress…"),
    "cut_mid_file.jsonl.zst": (lambda ls: _zstd_cut_after(ls, 120), 121, "file",
                               "truncated: cannot decompress…"),
    # one zstd block holds the whole (small) file: half of it decompresses to nothing
    "cut_in_half.jsonl.zst": (lambda ls: _first_half(_zstd(b"".join(ls))), 1, "file",
                              "truncated: cannot decompress…"),
    "not_gzip.jsonl.gz": (lambda ls: b"".join(ls), 1, "file", "cannot decompress (Not a gzipped file…"),
    "not_zstd.jsonl.zst": (lambda ls: b"".join(ls), 1, "file", "cannot decompress (…"),
    "empty.jsonl.zst": (lambda ls: b"", 1, "header", "empty file"),
    "empty.jsonl.gz": (lambda ls: gzip.compress(b""), 1, "header", "empty file"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_unreadable_file_gives_one_line(tmp_path: Path, name: str) -> None:
    build, line, field, problem = CASES[name]
    path = tmp_path / name
    path.write_bytes(build(_lines(tmp_path)))
    with pytest.raises(TraceError) as info:
        read_trace(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    if problem.endswith("…"):
        assert err.problem.startswith(problem[:-1]), err.problem
    else:
        assert err.problem == problem
    assert str(err) == f"{path}:{line}: {field}: {err.problem}"
    assert "\n" not in str(err)


def test_lines_before_a_bad_one_are_yielded(tmp_path: Path) -> None:
    """Streaming: a cut in the middle costs only the lines after it."""
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(_gzip_cut_after(_lines(tmp_path), 120))
    got = []
    with pytest.raises(TraceError, match=r"cut\.jsonl\.gz:121: file: truncated"):
        for line, _ in TraceReader(path):
            got.append(line)
    assert got == list(range(2, 121))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as info:
        TraceReader(tmp_path / "nope.jsonl")
    assert (info.value.line, info.value.field) == (0, "file")
    assert info.value.problem == "No such file or directory"
    with pytest.raises(TraceError) as info:
        TraceReader(tmp_path)
    assert (info.value.line, info.value.field) == (0, "file")


def test_valid_compressed_files_still_read(tmp_path: Path) -> None:
    """The byte-wise reader reads what the writer writes, also multi-frame zstd."""
    steps = _steps(50)
    for suffix in (".jsonl", ".jsonl.gz", ".jsonl.zst"):
        write_trace(tmp_path / f"t{suffix}", TraceHeader(), steps)
        assert read_trace(tmp_path / f"t{suffix}")[1] == steps
    lines = (tmp_path / "t.jsonl").read_bytes().splitlines(keepends=True)
    two_frames = _zstd(b"".join(lines[:20])) + _zstd(b"".join(lines[20:]))
    (tmp_path / "two.jsonl.zst").write_bytes(two_frames)
    assert read_trace(tmp_path / "two.jsonl.zst")[1] == steps


def test_trace_files_in_skips_dot_files_and_others(tmp_path: Path) -> None:
    for name in ("b.jsonl.gz", "a.jsonl", "c.jsonl.zst", ".tmp-k3j2h1a.jsonl", ".tmp-x1.jsonl.gz",
                 ".hidden.jsonl", "README.txt", "data.json", "notes.jsonl.bak"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub.jsonl").mkdir()
    assert [p.name for p in trace_files_in(tmp_path)] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst"]
    assert trace_files_in(tmp_path / "sub.jsonl") == []
