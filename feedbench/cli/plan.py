"""``feedbench plan``: fit the scaling curve of a scan, project it, check the projection."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from feedbench.cli import options as o
from feedbench.cli.app import Outputs, app, out, results_path


@app.command(short_help="Project a scan's curve to more GPUs, with its band.")
def plan(
    results: Annotated[Path, typer.Argument(help="A scan results file (feedbench scan --json).")],
    rate: Annotated[
        float | None,
        typer.Option(
            help="Samples/s one accelerator takes at full use (default: the scan's "
            "--profile/--rate/--workload accelerator)."
        ),
    ] = None,
    target_au: Annotated[
        float | None,
        typer.Option(help="Utilisation that counts as fed (default: the scan's, else 0.9)."),
    ] = None,
    at: Annotated[
        int | None,
        typer.Option(
            "--at", help="Consumer (accelerator) count to project to; at most 4× the largest."
        ),
    ] = None,
    cost: Annotated[
        float | None,
        typer.Option(help="USD: the system's price, for the cost per fed accelerator."),
    ] = None,
    passes: Annotated[
        str | None, typer.Option(help="Passes to fit: cold, warm or both (default: all measured).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the parameter draws the bands come from.")] = 0,
    json_out: o.Json = None,
    plots: o.Plots = True,
) -> None:
    """Fit a scan's scaling curve, project it with its band, check the projection.

    USL, Amdahl and a storage-limit model fitted to the aggregate rate against consumers; the
    knee, the rate and accelerators fed as bands, and a held-out check (the largest count
    predicted from the others). Refuses with fewer than 4 judged counts or a target past 4× the
    largest; flags a scan not valid for sizing."""
    from feedbench.core import envelope
    from feedbench.core.errors import FeedbenchError
    from feedbench.project import projection
    from feedbench.project.console import render_plan

    scan = _scan(results, at, cost)
    target = results_path(json_out, "plan")
    appetite, au, demand = projection.demand_of(scan, rate, target_au)
    if cost is not None and demand is None:
        raise FeedbenchError("--cost needs a demand: give --rate, or scan with --profile/--rate")
    ask = projection.Ask(demand=demand, target=at, cost_usd=cost, seed=seed)
    asked = {"rate": rate, "target_au": target_au, "at": at, "cost": cost, "passes": passes}
    # the scan's client, storage and what slowed it: what the projection describes
    kept = {k: scan.config[k] for k in ("describe", "read_latency_s") if k in scan.config}
    env = envelope.envelope(projection.KIND, {**asked, "seed": seed, **kept})
    env |= {"system": scan.system, "host": scan.host}
    result = projection.plan(scan, str(results), ask, pass_names(passes), env, appetite, au)
    render_plan(result, out)
    _write(result, target, plots)


def _scan(results: Path, at: int | None, cost: float | None):
    """The scan results file, its options checked first: one ``error:`` line each."""
    from feedbench.core import envelope
    from feedbench.core.errors import FeedbenchError
    from feedbench.report.current_rules import load_scan

    data = envelope.read(results)
    kind = data.get("kind", "scan")
    if kind != "scan":
        raise FeedbenchError(f"{results} is a {kind} results file; plan takes a scan's")
    if at is not None and at < 1:
        raise FeedbenchError(f"--at {at}: give a consumer count of 1 or more")
    if cost is not None and cost <= 0:
        raise FeedbenchError(f"--cost {cost:g}: a price must be above 0")
    return load_scan(results, data)[0]  # judged by today's sizing rules, as report does


def _write(result, target: Path, plots: bool) -> None:
    from feedbench.core import envelope

    outputs = Outputs(target)
    outputs.write("results", envelope.save, result, target)
    if "results" not in outputs.failed:
        out.print(f"results: {target}")
    if plots:
        from feedbench.project.plots import plan_plot  # matplotlib: only to draw

        written = outputs.write("plots", plan_plot, result, target.parent / f"{target.stem}.png")
        if written:
            out.print(f"plots: {written}")
    outputs.check()


def pass_names(given: str | None) -> list[str] | None:
    from feedbench.core.errors import FeedbenchError

    if given is None:
        return None
    names = ["cold", "warm"] if given == "both" else [p.strip() for p in given.split(",")]
    bad = [p for p in names if p not in ("cold", "warm")]
    if bad:
        raise FeedbenchError(f"--passes {given!r}: give cold, warm or both")
    return names
