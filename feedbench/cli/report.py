"""``feedbench report``: any results file shown again, or as an HTML page, Markdown or CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from feedbench.cli import options as o
from feedbench.cli.app import app, out

Target = Annotated[Path | None, typer.Option(metavar="PATH")]


@app.command(short_help="Show a results file again; write it as HTML, Markdown or CSV.")
def report(
    results: Annotated[
        Path,
        typer.Argument(
            metavar="RESULTS",
            help="A results file: scan, verify, compare, plan or prediction check.",
        ),
    ],
    html: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Also write one self-contained HTML page here: the "
            "answer, summary table, charts, system under test, method, command.",
        ),
    ] = None,
    md: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Also write Markdown here: the answer, the summary "
            "table, the system under test and the command.",
        ),
    ] = None,
    csv: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Also write the summary table as CSV here: a scan's every repeat "
            "(numbered from 1) and each point's mean (repeat mean); one row per "
            "system (compare) or run (verify).",
        ),
    ] = None,
    wide: o.Wide = False,
) -> None:
    """Show a results file again, as the command printed it (and as HTML, Markdown or CSV)."""
    from feedbench.report.export import write_exports
    from feedbench.report.kinds import load_any, render

    kind, result = load_any(results)
    render(kind, result, out, wide)
    for what, written in write_exports(kind, result, str(results), html=html, md=md, csv=csv):
        out.print(f"{what}: {written}")
