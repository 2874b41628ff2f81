"""Every command's ``--help`` in a plain 80-column terminal: nothing cut, and each command's help
speaks of that command only."""

from __future__ import annotations

import re

import pytest

COMMANDS = ["", "scan", "verify", "compare", "report", "sample", "plan"]


@pytest.fixture
def help_of(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")

    def run(command: str) -> str:
        r = cli(*[c for c in (command,) if c], "--help")
        assert r.code == 0, r.err
        return r.out

    return run


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_uncut(help_of, command):
    text = help_of(command)
    lines = text.splitlines()
    assert len(lines) > 5
    assert max(len(line) for line in lines) <= 80, text
    assert "…" not in text, text
    # "..." only where the usage line says "more than one"
    body = "\n".join(line for line in lines if not line.startswith("Usage:"))
    assert not re.search(r"\w\.\.\.|\.\.\.\s*$", body, re.M), text


def test_top_level_help_names_each_command_in_full(help_of):
    text = help_of("")
    for command in COMMANDS[1:]:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(command + " "))
        assert line.rstrip().endswith((".", "?")), line


def test_scan_and_verify_help_speak_of_themselves(help_of):
    scan, verify = help_of("scan"), help_of("verify")
    assert "verify" not in scan
    assert "scan" not in verify.replace("--scaling", "")
    assert "Emulated consumers" in scan
    assert "Training ranks" in verify
