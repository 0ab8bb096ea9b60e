"""Errors that end a command with one line and exit status 2 (no traceback),
and the exit statuses every command shares."""

EXIT_CLEAN = 0  # nothing new
EXIT_FINDINGS = 1  # new findings (or a regression, a surviving mutant)
EXIT_USAGE = 2  # bad arguments or input: one line on stderr, no report
# simrig's own code raised (a check, the harness): every such exception is a
# ``rig_error`` finding with its traceback in the report, which is still
# written; the run's verdict is incomplete, so this wins over EXIT_FINDINGS.
EXIT_RIG_ERROR = 3
# Ctrl-C stopped a replay or selftest before its end: the report holds what was
# done so far, but the verdict covers only that part (the shell's 128 + SIGINT).
EXIT_INTERRUPTED = 130


class UsageError(ValueError):
    """Bad arguments or input: printed as one line, exit 2."""


def describe_io_error(exc: BaseException) -> str:
    """One line for an error reading input or writing output, naming the file:
    ``reports/x: Permission denied``, ``t.jsonl: not UTF-8 text (byte 0xff at 17)``."""
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start:exc.start + 1].hex()
        return f"not UTF-8 text (invalid byte 0x{bad} at offset {exc.start})"
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else ""
        if exc.filename2 is not None:
            where = f"{where} -> {exc.filename2}"
        what = exc.strerror or str(exc) or type(exc).__name__
        return f"{where}: {what}" if where else what
    return f"{type(exc).__name__}: {exc}"
