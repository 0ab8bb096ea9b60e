"""The same flag means the same thing in every command; help texts list exit statuses;
vLLM's own import notes stay out of the way unless --verbose."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from simrig.cli import build_parser

REPORT_COMMANDS = ("replay", "fuzz", "selftest")


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_report_commands_share_their_flags():
    commands = _subparsers()
    for name in REPORT_COMMANDS:
        options = {o: a for a in commands[name]._actions for o in a.option_strings}
        for flag in ("--out", "--progress", "--quiet", "--json", "--verbose"):
            assert flag in options, f"simrig {name} lacks {flag}"
        assert list(options["--progress"].choices) == ["tty", "plain", "quiet"]


@pytest.mark.parametrize("command, needed", [("replay", ["t.jsonl"]), ("fuzz", []), ("selftest", [])])
def test_memcheck_is_on_unless_no_memcheck_in_every_report_command(command, needed):
    parser = build_parser()
    assert parser.parse_args([command, *needed]).memcheck is True
    assert parser.parse_args([command, *needed, "--no-memcheck"]).memcheck is False
    assert parser.parse_args([command, *needed, "--memcheck"]).memcheck is True  # old scripts' spelling
    action = next(a for a in _subparsers()[command]._actions if a.dest == "memcheck")
    assert action.option_strings == ["--memcheck", "--no-memcheck"]
    assert "KernelMemoryError" in action.help  # the one declaration, simrig.cli.flags.add_memcheck_flag


def test_every_command_has_verbose_and_lists_exit_statuses():
    for name, command in _subparsers().items():
        assert "--verbose" in {o for a in command._actions for o in a.option_strings}, name
        assert "exit status" in (command.epilog or "").lower(), f"simrig {name} --help"


@pytest.mark.vllm
def test_vllm_import_notes_hidden_by_default():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "simrig", "doctor"], capture_output=True,
                          text=True, timeout=300, env=env)
    printed = proc.stdout + proc.stderr
    assert "vllm " in printed and "Failed to import from vllm._C" not in printed
    assert "Pinned memory" not in printed


def test_verbose_leaves_vllm_logging_alone(monkeypatch):
    from simrig.cli import quiet_vllm_logs

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    logger = logging.getLogger("vllm")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    quiet_vllm_logs(verbose=True)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO" and logger.level == logging.NOTSET
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    quiet_vllm_logs(verbose=False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR" and logger.level == logging.ERROR
