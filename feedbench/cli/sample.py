"""``feedbench sample``: a deterministic ImageNet-like dataset to scan and train on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from feedbench.cli import options as o
from feedbench.cli.app import app, err, out
from feedbench.core.errors import FeedbenchError
from feedbench.core.workloads import MIN_SAMPLES  # not sample_workload: it imports torch


@app.command(short_help="Make a sample dataset: JPEGs, tar shards or a workload's data.")
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
    pool: Annotated[
        int | None,
        typer.Option(
            help="Images rendered and encoded once (default: one per 1,024 images, up to 256; one "
            "per class at least); every image written is a copy of one with its own bytes (same "
            "size, same decode work).",
            show_default=False,
        ),
    ] = None,
    part: Annotated[
        str | None,
        typer.Option(
            metavar="K/M",
            help="Write part K (0..M-1) of M: M hosts writing parts 0..M-1 of one --seed make "
            "the files of one run. Default: RANK/WORLD_SIZE under torchrun, else 0/1.",
        ),
    ] = None,
    workload: o.Workload = None,
    size: Annotated[
        float | None,
        typer.Option(
            help="With --workload: GB to write (sample sizes scaled down when it holds fewer "
            f"than {MIN_SAMPLES} samples of the workload's size)."
        ),
    ] = None,
    list_workloads: o.ListWorkloads = False,
) -> None:
    """Make a deterministic ImageNet-like sample dataset (JPEG tree and/or WebDataset shards),
    or with --workload the data of an MLPerf-Storage-shaped workload (--list-workloads)."""
    from feedbench.sample import SampleSpec, make_sample

    if workload is not None or size is not None:
        _workload(out_dir, workload, size, seed, jobs)
        return

    spec = SampleSpec(images, seed, classes, quality, per_shard, fmt, pool)
    k, m = _part(part)
    if jobs is None and "LOCAL_WORLD_SIZE" in os.environ:  # torchrun: the cores shared out
        jobs = max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"]))
    # a bar on a terminal only: elsewhere (a log, a pipe) a transient bar shows nothing, and rich
    # ends it with an empty line, which came before an error line
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=images < 200 or not err.is_interactive,
    ) as bar:
        task = bar.add_task("encoding the pool", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            what = "encoding the pool" if stage == "pool" else "writing images"
            if bar.tasks[0].description != what:
                bar.reset(task, description=what)
            bar.update(task, completed=done, total=total)

        summary = make_sample(out_dir, spec, jobs=jobs, part=(k, m), progress=progress)
    where = ", ".join(x for x in (summary.tree_dir, summary.shard_dir) if x)
    out.print(
        (f"part {k}/{m} of " if m > 1 else "")
        + f"{summary.images:,} images in {summary.classes} classes → {where}"
        + (f" ({summary.shards} shards)" if summary.shards else "")
        + f"; mean {summary.mean_jpeg_bytes / 1e3:.1f} KB, sides "
        f"{summary.min_side_px}–{summary.max_side_px} px"
    )


def _part(text: str | None) -> tuple[int, int]:
    """``--part K/M``, else torchrun's RANK/WORLD_SIZE, else the whole dataset."""
    if text is None:
        text = f"{os.environ.get('RANK', 0)}/{os.environ.get('WORLD_SIZE', 1)}"
    k, _, m = text.partition("/")
    if not (k.isdigit() and m.isdigit()) or not 0 <= int(k) < int(m):
        raise FeedbenchError(f"--part {text}: give K/M with 0 <= K < M, e.g. --part 0/4")
    return int(k), int(m)


def _workload(
    out_dir: Path, workload: str | None, size_gb: float | None, seed: int, jobs: int | None
) -> None:
    from rich.progress import DownloadColumn, TransferSpeedColumn

    from feedbench.sample_workload import make_workload

    if workload is None or size_gb is None:
        raise FeedbenchError("--workload and --size go together: e.g. --workload unet3d --size 10")
    with Progress(
        TextColumn(f"writing {workload}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_interactive,  # as above: no empty line in a log
    ) as bar:
        task = bar.add_task("sample", total=size_gb * 1e9)
        s = make_workload(out_dir, workload, size_gb, seed=seed, jobs=jobs,
                          progress=lambda n: bar.advance(task, n))  # fmt: skip
    from feedbench.report.fmt import fmt_bytes

    scaled = f", sizes scaled ×{s.scale:.3g} to fit --size" if s.scale < 1 else ""
    out.print(
        f"{s.workload}: {s.samples:,} samples in {s.files:,} {s.fmt} files → {out_dir}/data; "
        f"{s.bytes / 1e9:.3f} GB, samples {fmt_bytes(s.mean_sample_bytes)} ± "
        f"{fmt_bytes(s.std_sample_bytes)}{scaled}"
    )
