"""``feedbench compare``: several scans side by side, for storage procurement."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from feedbench.cli import options as o
from feedbench.cli.app import Outputs, app, out, results_path

Results = Annotated[
    list[Path],
    typer.Argument(
        metavar="RESULTS",
        help="Two or more scan results files (feedbench scan --json); or scans and verify "
        "results files: scan's predicted data wait beside verify's measured one.",
    ),
]
Labels = Annotated[
    list[str] | None,
    typer.Option("--label", "-L", help="A name per file, in order (default: the file names)."),
]
Costs = Annotated[
    list[str] | None,
    typer.Option("--cost", help="LABEL=USD: a system's price, for the cost per accelerator fed."),
]
PlotAlias = Annotated[Path | None, typer.Option("--plot", hidden=True)]


@app.command(short_help="Several scans side by side: which one feeds more GPUs.")
def compare(
    results: Results,
    label: Labels = None,
    passes: Annotated[str, typer.Option(help="The pass to compare: cold or warm.")] = "cold",
    cost: Costs = None,
    json_out: o.Json = None,
    plots: o.Plots = True,
    pass_alias: o.PassAlias = None,
    plot: PlotAlias = None,
) -> None:
    """Put several scan results side by side: throughput per consumer count, bottleneck, how many
    GPUs each feeds, which differences are larger than the measurements' spread."""
    from feedbench.core import envelope
    from feedbench.core.choices import choose
    from feedbench.core.redact import scrub
    from feedbench.report import compare as cmp_mod
    from feedbench.report.compare_console import render_compare

    which = choose(pass_alias or passes, ("cold", "warm"), "--passes")
    kinds = [envelope.read(p).get("kind", "scan") for p in results]  # each file read once here
    if "verify" in kinds:
        _check_prediction(results, kinds, label, which, json_out)
        return
    prices = _prices(cost or [])
    cmp = scrub(cmp_mod.compare([str(p) for p in results], label, which, prices))
    render_compare(cmp, out)
    target = results_path(json_out, "compare")
    outputs = Outputs(target)
    outputs.write("results", cmp_mod.save, cmp, target)
    if "results" not in outputs.failed:
        out.print(f"results: {target}")
    png = plot or (target.parent / f"{target.stem}-scaling.png" if plots else None)
    if png is not None:
        from feedbench.report.compare_plots import compare_plot  # matplotlib: only to draw

        written = outputs.write("plots", compare_plot, cmp, png)
        if written:
            out.print(f"plots: {written}")
    outputs.check()


def _check_prediction(results: list[Path], kinds: list[str], label, which: str, json_out) -> None:
    from feedbench.core import envelope
    from feedbench.core.errors import FeedbenchError
    from feedbench.core.redact import scrub
    from feedbench.report import prediction

    labels = label or [p.stem for p in results]
    if len(labels) != len(results):
        raise FeedbenchError(f"--label given {len(labels)} times for {len(results)} files")
    files = list(zip(labels, map(str, results), kinds, strict=True))
    scans = [(lb, p) for lb, p, kind in files if kind == "scan"]
    verifies = [(lb, p) for lb, p, kind in files if kind == "verify"]
    check = scrub(prediction.check(scans, verifies, which))
    prediction.render(check, out)
    target = results_path(json_out, "prediction")
    envelope.save(check, target)
    out.print(f"results: {target}")


def _prices(given: list[str]) -> dict[str, float]:
    from feedbench.core.errors import FeedbenchError

    prices = {}
    for item in given:
        label, _, usd = item.partition("=")
        try:
            prices[label.strip()] = float(usd.replace(",", "").lstrip("$"))
        except ValueError:
            raise FeedbenchError(f"--cost {item!r}: write LABEL=USD, e.g. nfs=120000") from None
    return prices
