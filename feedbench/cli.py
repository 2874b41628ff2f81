"""The feedbench command line: parse, call, render, write results. Thin by design."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from feedbench import __version__
from feedbench.errors import FeedbenchError

app = typer.Typer(
    help="Can this storage and this CPU keep my GPUs fed? Measure data iteration, stage by stage.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)


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
    bundled = Path(__file__).resolve().parent.parent / "sample_data"
    if bundled.is_dir():
        return str(bundled)
    raise FeedbenchError("no PATH given and no sample_data/ here: pass a directory to scan")


@app.command()
def sample(
    out_dir: Annotated[Path, typer.Argument(metavar="OUT", help="New or empty directory.")],
    images: Annotated[int, typer.Option("--images", "-n", help="Number of images.")] = 1000,
    fmt: Annotated[
        str, typer.Option("--format", help="jpeg (class tree), wds (tar), both.")
    ] = "both",
    seed: Annotated[int, typer.Option(help="Same seed, byte-identical output.")] = 0,
    classes: Annotated[int, typer.Option(help="Number of classes (class folders).")] = 10,
    quality: Annotated[int, typer.Option(help="JPEG quality.")] = 90,
    per_shard: Annotated[
        int | None, typer.Option(help="Samples per tar shard (default: images/16, 1..1000).")
    ] = None,
    jobs: Annotated[int | None, typer.Option(help="Processes (default: all cores).")] = None,
) -> None:
    """Make a deterministic ImageNet-like sample dataset (JPEG tree and/or WebDataset shards)."""
    from feedbench.sample import SampleSpec, make_sample

    spec = SampleSpec(images, seed, classes, quality, per_shard, fmt)
    with Progress(
        TextColumn("generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=images < 200,
    ) as bar:
        task = bar.add_task("sample", total=images)
        summary = make_sample(out_dir, spec, jobs=jobs, progress=lambda n: bar.advance(task, n))
    where = ", ".join(x for x in (summary.tree_dir, summary.shard_dir) if x)
    out.print(
        f"{summary.images:,} images in {summary.classes} classes → {where}"
        + (f" ({summary.shards} shards)" if summary.shards else "")
        + f"; mean {summary.mean_jpeg_bytes / 1e3:.1f} KB, sides "
        f"{summary.min_side_px}–{summary.max_side_px} px"
    )


@app.command()
def scan(
    path: Annotated[
        str | None,
        typer.Argument(help="Image tree, .tar shard(s) or directory (default: sample_data/)."),
    ] = None,
    stages: Annotated[
        str, typer.Option(help="Cumulative stages: read,decode,augment,collate,transfer.")
    ] = "read,decode,augment",
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Samples per batch.")] = 64,
    passes: Annotated[str, typer.Option(help="cold (evicted first), warm, or cold,warm.")] = "cold",
    fmt: Annotated[str, typer.Option("--format", help="auto, tree or shards.")] = "auto",
    drop_caches: Annotated[
        bool, typer.Option(help="Also write /proc/sys/vm/drop_caches (root) before cold passes.")
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Results file (default: results/scan-TIME.json).")
    ] = None,
) -> None:
    """Measure how fast PATH can be iterated, stage by stage."""
    from feedbench import results as res
    from feedbench.render import render_scan
    from feedbench.run import ScanConfig, parse_passes, unusable
    from feedbench.run import scan as run_scan
    from feedbench.stages import parse_stages

    config = ScanConfig(
        path=path if path is not None else default_data(),
        stages=parse_stages(stages),
        batch_size=batch_size,
        passes=parse_passes(passes),
        fmt=fmt,
        drop_caches=drop_caches,
    )
    target = json_out or Path("results") / time.strftime("scan-%Y%m%d-%H%M%S.json")

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    )

    def progress_start(name: str, total_bytes: int):
        task = bar.add_task(f"{name} pass", total=total_bytes)
        return lambda n, nbytes: bar.advance(task, nbytes)

    with bar:
        result = run_scan(
            config, progress_start=progress_start, on_update=lambda r: res.save(r, target)
        )
    res.save(result, target)
    render_scan(result, out)
    out.print(f"results: {target}")
    problem = unusable(result)
    if problem:
        raise FeedbenchError(problem)
    if result.partial:
        err.print("interrupted: partial results written")
        raise typer.Exit(130)


def main() -> None:
    try:
        app()
    except FeedbenchError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
