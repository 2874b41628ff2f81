"""The command line: one module per command, options declared once (:mod:`.options`)."""

from feedbench.cli import compare, plan, report, sample, scan, verify  # noqa: F401 - register commands
from feedbench.cli.app import app, main

__all__ = ["app", "main"]
