"""``feedbench report``: any results file shown again, or as one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from feedbench.cli.app import app, out


@app.command()
def report(
    results: Annotated[Path, typer.Argument(help="A results file of scan, verify or compare.")],
    html: Annotated[
        Path | None,
        typer.Option(help="Also write one self-contained HTML page here (tables and plots)."),
    ] = None,
) -> None:
    """Show a results file again, as the command printed it (and as HTML with --html)."""
    from feedbench.report.html import write_html
    from feedbench.report.kinds import load_any, render

    kind, result = load_any(results)
    render(kind, result, out)
    if html is not None:
        written = write_html(kind, result, str(results), html)
        out.print(f"html: {written}")
