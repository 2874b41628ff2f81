"""``feedbench sample``: a deterministic ImageNet-like dataset to scan and train on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from feedbench.cli.app import app, err, out


@app.command()
def sample(
    out_dir: Annotated[Path, typer.Argument(metavar="OUT", help="New or empty directory.")],
    images: Annotated[int, typer.Option("--images", "-n", help="Number of images.")] = 1000,
    fmt: Annotated[
        str, typer.Option("--format", help="tree (JPEG class folders), shards (tar), or both.")
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
