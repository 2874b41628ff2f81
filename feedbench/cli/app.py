"""The ``feedbench`` application: its commands register here; :func:`main` is the entry point."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from feedbench.core.errors import FeedbenchError, NotWritten
from feedbench.version import __version__

app = typer.Typer(
    help="Can this storage and this CPU keep my GPUs fed? Measure data iteration, stage by stage.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)
out = Console()
err = Console(stderr=True)
T = TypeVar("T")
LOG_WIDTH = 10_000  # no line here is longer: a file's lines hold what they hold, unbroken


def fit_width() -> None:
    """A terminal's output wraps at its width. Output to a file or a pipe (a batch job's log,
    ``| tee``) would get rich's 80 columns: paths broken over lines and table cells cut short
    ("48…" for a rate), so there lines are as long as they need to be, unless COLUMNS is set."""
    for console in (out, err):
        to_file = not console.is_terminal and "COLUMNS" not in os.environ
        console.width = LOG_WIDTH if to_file else None  # type: ignore[assignment]


def _version(value: bool) -> None:
    if value:
        out.print(f"feedbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    pass


def default_data() -> str:
    """``sample_data/`` in the working directory, else the one beside the installed package."""
    here = Path("sample_data")
    if here.is_dir():
        return str(here)
    bundled = Path(__file__).resolve().parent.parent.parent / "sample_data"
    if bundled.is_dir():
        return str(bundled)
    raise FeedbenchError("no PATH given and no sample_data/ here: pass a directory to scan")


def results_path(given: Path | None, command: str) -> Path:
    """Where a command writes its results file: ``--json``, else ``results/COMMAND-TIME.json``;
    checked writable before anything is measured (the folder is made if needed)."""
    target = given or Path("results") / time.strftime(f"{command}-%Y%m%d-%H%M%S.json")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as e:
        raise FeedbenchError(f"cannot write results to {target}: {e.strerror or e}") from None
    if target.is_dir():
        raise FeedbenchError(f"cannot write results to {target}: it is a directory")
    return target


class Outputs:
    """The files a command writes, each one tried: one that cannot be written (a full disk) is
    noted and the others still written; :meth:`check` then ends the command with one ``error:``
    line and exit 4 (measured, not all written)."""

    def __init__(self, target: Path) -> None:
        self.target = target  # the results file
        self.failed: dict[str, str] = {}  # what → why
        self.warned = False

    def update(self, result: Any) -> None:
        """The results file rewritten mid-run; when it cannot be, measuring goes on (it is tried
        again at the end) and the user is told once."""
        from feedbench.core.envelope import save

        try:
            save(result, self.target)
        except NotWritten as e:
            if not self.warned:
                err.print(f"warning: {e}; measuring goes on", markup=False, highlight=False)
                self.warned = True

    def write(self, what: str, writer: Callable[..., T], *args: Any) -> T | None:
        """``writer(*args)``, or None when it could not write (``what`` noted)."""
        try:
            return writer(*args)
        except NotWritten as e:
            self.failed[what] = str(e)
        except OSError as e:  # a plot: matplotlib's own write
            self.failed[what] = f"cannot write {e.filename or what}: {e.strerror or e}"
        return None

    def check(self, state: str | None = None) -> None:
        """Raise :class:`NotWritten` when something was not written; ``state``: how the run
        itself ended, when not complete (said in the same line)."""
        if self.failed:
            also = f" (and the run {state})" if state else ""
            raise NotWritten(f"measured, not all written{also}: " + "; ".join(self.failed.values()))


def error_line(e: FeedbenchError) -> None:
    from feedbench.core.redact import scrub_text
    from feedbench.report.fmt import visible  # a name in a message: one line, colouring nothing

    if e.details:
        details = "\n".join(visible(line) for line in scrub_text(e.details).split("\n"))
        err.print(details, markup=False, highlight=False, soft_wrap=True)
    line = f"error: {visible(scrub_text(str(e)))}"
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    fit_width()
    try:
        app()
    except FeedbenchError as e:
        error_line(e)
        sys.exit(e.code)
