"""Errors that end a command with one line and exit status 2 (no traceback)."""


class UsageError(ValueError):
    """Bad arguments or input: printed as one line, exit 2."""
