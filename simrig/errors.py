"""Errors that end a command with one line and exit status 2 (no traceback),
and the exit statuses every command shares."""

EXIT_CLEAN = 0  # nothing new
EXIT_FINDINGS = 1  # new findings (or a regression, a surviving mutant)
EXIT_USAGE = 2  # bad arguments or input: one line on stderr, no report
# simrig's own code raised (a check, the harness): every such exception is a
# ``rig_error`` finding with its traceback in the report, which is still
# written; the run's verdict is incomplete, so this wins over EXIT_FINDINGS.
EXIT_RIG_ERROR = 3


class UsageError(ValueError):
    """Bad arguments or input: printed as one line, exit 2."""
