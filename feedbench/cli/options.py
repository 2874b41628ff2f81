"""The options of the commands, each declared once: a flag means the same in every command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Data = Annotated[
    str | None,
    typer.Argument(
        metavar="PATH",
        help="Image tree, .tar shard(s) (a folder, a glob or a brace list), data files (.npy, "
        ".npz, .tfrecord, .h5, .parquet; any file with --format files), a feedbench sample "
        "root, or an s3:// or http(s):// URL of one (default: sample_data/).",
        show_default=False,
    ),
]
Consumers = Annotated[
    str,
    typer.Option(
        "--consumers",
        "--gpus",
        "-c",
        help="Emulated consumers (GPUs: one process each, as DDP ranks), e.g. 8 or 1,2,4,8 "
        "(a curve).",
    ),
]
Gpus = Annotated[
    str,
    typer.Option(
        "--gpus",
        "--consumers",
        "-c",
        help="Training ranks (DDP, one process each; CPU processes without a GPU), e.g. 8 or "
        "1,2,4,8.",
    ),
]
Workers = Annotated[
    int | None,
    typer.Option(help="Loader workers per rank (DALI: threads). Default: the cores shared out."),
]
BatchSize = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        "-b",
        help="Samples per consumer (default: the workload's or profile's, else 64; 4 on the "
        "bundled sample).",
    ),
]
GpuBatchSize = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        "-b",
        help="Per GPU with --scaling weak, global with strong (default 256; CPU: 16).",
    ),
]
Warmup = Annotated[
    int | None,
    typer.Option(
        help="Batches per consumer left out of every rate and AU, at least (more while the "
        "loader is still starting up; 0: none, every batch measured)."
    ),
]
GpuWarmup = Annotated[
    int | None,
    typer.Option(
        help="Steps per rank left out of every rate, before the clock (default 20; CPU: 5)."
    ),
]
WarmupAlias = Annotated[int | None, typer.Option("--warmup-batches", hidden=True)]
Passes = Annotated[
    str, typer.Option(help="cold (the data evicted from the page cache first), warm, or both.")
]
PassAlias = Annotated[str | None, typer.Option("--pass", hidden=True)]
TargetAu = Annotated[
    float | None,
    typer.Option(
        help="Accelerator utilisation that counts as fed: compute time ÷ step time (a step "
        "waiting more than 1 − this for data is data-bound). Default 0.9; with --workload: "
        "its row's."
    ),
]
GpuTargetAu = Annotated[
    float,
    typer.Option(
        help="The share of each step a GPU must spend computing, not waiting for data, to count "
        "as fed."
    ),
]
Format = Annotated[
    str,
    typer.Option(
        "--format",
        help="auto, tree (an image tree), shards (tar shards), or data files: files (any file "
        "is a sample, raw bytes), npy, npz (a file is a sample), tfrecord (a record is one), "
        "hdf5 (a row of the largest dataset; hdf5:NAME names one), parquet (a row group; "
        "parquet:rows=N: N rows, each read as the row groups holding them, a file's short last "
        "sample kept).",
    ),
]
Seed = Annotated[int, typer.Option(help="Shuffle, augmentation and model seed.")]
Json = Annotated[
    Path | None,
    typer.Option("--json", help="Results file (default: results/COMMAND-TIME.json)."),
]
Plots = Annotated[bool, typer.Option(help="Write PNG plots beside the results file.")]
Wide = Annotated[
    bool,
    typer.Option(
        "--wide", help="Every column in the terminal's tables (files/s, efficiency, workers)."
    ),
]
Profile = Annotated[
    str | None, typer.Option(help="Emulated accelerator, e.g. resnet50-h200 (see profiles).")
]
Workload = Annotated[
    str | None,
    typer.Option(help="An MLPerf-Storage-shaped workload: resnet50, unet3d or cosmoflow."),
]


def _list_workloads(value: bool) -> None:
    if value:
        from feedbench.cli.app import out
        from feedbench.report.workloads import render_workloads

        render_workloads(out)
        raise typer.Exit()


ListWorkloads = Annotated[
    bool,
    typer.Option(
        "--list-workloads",
        callback=_list_workloads,
        is_eager=True,
        help="Show the workloads, their rows per accelerator and their sources, and exit.",
    ),
]
