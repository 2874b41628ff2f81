"""``feedbench verify``: real DDP training per loader and GPU count; are the GPUs fed?"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from feedbench.cli import options as o
from feedbench.cli.app import Outputs, app, default_data, err, out, results_path
from feedbench.core.errors import EXIT_INTERRUPTED, MeasurementFailed

if TYPE_CHECKING:
    from feedbench.verify.config import VerifyConfig
    from feedbench.verify.results import VerifyResult

LoaderNames = Annotated[
    str | None,
    typer.Option(
        "--loader",
        "-l",
        help="baseline (stock DataLoader), dali-example (DALI as in its ResNet-50 example, GPU), "
        "torch, dali, wds, auto, synthetic (default: baseline + every loader installed but auto), "
        "or your own factory, FILE.py:FUNCTION or MODULE:FUNCTION, called in every rank with the "
        "keywords it takes among rank, world_size, local_rank, batch_size, workers, seed, "
        "epoch, path; it yields (images, labels) or images alone (then labels are made up).",
    ),
]
Model = Annotated[
    str | None,
    typer.Option(help="resnet50, resnet18 or smallcnn (default: resnet50; CPU: smallcnn)."),
]
Steps = Annotated[int | None, typer.Option(help="Measured steps per run (default 200; CPU: 30).")]
Scaling = Annotated[
    str, typer.Option(help="weak: fixed batch per GPU; strong: fixed global batch.")
]
ImageSize = Annotated[int | None, typer.Option(help="Training resolution (default 224; CPU: 64).")]
LoaderOption = Annotated[
    list[str] | None,
    typer.Option(
        "--loader-option",
        "-o",
        help="[LOADER:]KEY=VALUE for the library loaders (torch, dali, wds), e.g. "
        "dali:hw_decoder_load=0.99; repeatable. Without LOADER: every loader of the run that "
        "takes KEY, your factory included.",
    ),
]
StreamPriority = Annotated[
    str,
    typer.Option(
        help="normal, or high: train on the GPU's highest-priority CUDA stream, so a GPU loader's "
        "kernels yield to training's."
    ),
]
DdpOption = Annotated[
    list[str] | None,
    typer.Option(
        "--ddp-option",
        help="KEY=VALUE for DistributedDataParallel, repeatable: broadcast_buffers "
        "(forward_sync_buffers from PyTorch 2.14), gradient_as_bucket_view, static_graph "
        "(true/false), bucket_cap_mb. Every run, the "
        "synthetic ceiling too.",
    ),
]
Compile = Annotated[
    str,
    typer.Option(
        "--compile",
        help="torch.compile the model of every run: off, default, reduce-overhead (CUDA graphs) "
        "or max-autotune-no-cudagraphs; compiled in the warm-up steps.",
    ),
]
CpuAffinity = Annotated[
    str,
    typer.Option(
        help="inherit, or split: pin each rank (its loader threads and workers too) to its own "
        "equal share of the cores this command may use."
    ),
]
Device = Annotated[str, typer.Option(help="auto, cuda or cpu.")]
Synthetic = Annotated[bool, typer.Option(help="Also run synthetic data (on the GPU): the ceiling.")]
CeilingTwice = Annotated[
    bool | None,
    typer.Option(
        "--ceiling-twice/--ceiling-once",
        help="Run the synthetic ceiling again after the loaders at each GPU count: the ceiling is "
        "the mean of both runs, and how far it moved is said (default: twice on a GPU).",
        show_default=False,
    ),
]
Interleave = Annotated[
    int | None,
    typer.Option(
        help="After each loader's window, alternate blocks of this many steps on the loader and "
        "on a batch made on the GPU, as many loader steps as the window: its fraction of the "
        "ceiling and its slowdown paired block by block in one process, with 95% intervals, "
        "which the host's drift between runs cannot blur (0: off; default 25 on a GPU, 0 on the "
        "CPU).",
    ),
]
RunTimeout = Annotated[float, typer.Option(help="Stop a run after this many seconds.")]
KeepGoing = Annotated[
    bool, typer.Option(help="After a failed run, go on with the others (and fail at the end).")
]
SyncEachStep = Annotated[
    bool,
    typer.Option(
        hidden=True,
        help="Diagnostic: the host waits for the GPU after taking each batch (what a paced "
        "loader costs, measured on any loader, synthetic included).",
    ),
]


@app.command(short_help="Train with each loader on 1..N GPUs: do the GPUs stay fed?")
def verify(
    data: o.Data = None,
    consumers: o.Gpus = "1,2",
    loader: LoaderNames = None,
    model: Model = None,
    steps: Steps = None,
    warmup: o.GpuWarmup = None,
    batch_size: o.GpuBatchSize = None,
    scaling: Scaling = "weak",
    image_size: ImageSize = None,
    workers: o.Workers = None,
    loader_option: LoaderOption = None,
    stream_priority: StreamPriority = "normal",
    ddp_option: DdpOption = None,
    compile_mode: Compile = "off",
    cpu_affinity: CpuAffinity = "inherit",
    device: Device = "auto",
    synthetic: Synthetic = True,
    ceiling_twice: CeilingTwice = None,
    interleave: Interleave = None,
    target_au: o.GpuTargetAu = 0.9,
    seed: o.Seed = 0,
    run_timeout: RunTimeout = 1800.0,
    keep_going: KeepGoing = False,
    json_out: o.Json = None,
    plots: o.Plots = True,
    sync_each_step: SyncEachStep = False,
) -> None:
    """Train with each loader on 1..N GPUs (DDP, torchrun) and show whether the GPUs stay fed."""
    config = verify_config(locals())
    target = results_path(json_out, "verify")
    outputs = Outputs(target)
    result = run_with_status(config, outputs)
    write_outputs(result, target, plots, outputs)
    finish(result, target, outputs)


def verify_config(options: dict) -> VerifyConfig:
    """A VerifyConfig from the command's options (its ``locals()``); the checks that need this
    machine or the data are the plan's."""
    from feedbench.core.choices import parse_counts
    from feedbench.verify.config import VerifyConfig
    from feedbench.verify.loaders import parse_loaders

    data, loader = options["data"], options["loader"]
    return VerifyConfig(
        data=data if data is not None else default_data(),
        gpus=parse_counts(options["consumers"], "--consumers"),
        loaders=parse_loaders(loader) if loader is not None else None,
        synthetic=options["synthetic"],
        ceiling_twice=options["ceiling_twice"],
        interleave=options["interleave"],
        model=options["model"],
        steps=options["steps"],
        warmup=options["warmup"],
        batch_size=options["batch_size"],
        scaling=options["scaling"],
        image_size=options["image_size"],
        workers=options["workers"],
        loader_options=tuple(options["loader_option"] or ()),
        stream_priority=options["stream_priority"].strip().lower(),
        ddp_options=tuple(options["ddp_option"] or ()),
        compile=options["compile_mode"].strip().lower(),
        cpu_affinity=options["cpu_affinity"].strip().lower(),
        sync_each_step=options["sync_each_step"],
        device=options["device"],
        seed=options["seed"],
        target_au=options["target_au"],
        run_timeout_s=options["run_timeout"],
        keep_going=options["keep_going"],
    )


def run_with_status(config: VerifyConfig, outputs: Outputs) -> VerifyResult:
    """Plan and run every job, the current step on one status line; the results file is
    rewritten after each run, so a verify that dies keeps the runs it finished."""
    from feedbench.verify.run import verify as run_verify

    target = outputs.target
    status = err.status("planning…")

    def on_run(name: str, g: int, i: int, total: int) -> None:
        status.update(f"run {i + 1}/{total}: {name} on {g}…")

    with status:
        return run_verify(
            config,
            log_dir=str(target.parent / f"{target.stem}-logs"),
            on_update=outputs.update,
            on_run=on_run,
        )


def write_outputs(result: VerifyResult, target: Path, plots: bool, outputs: Outputs) -> None:
    from feedbench.core.envelope import save
    from feedbench.core.redact import scrub
    from feedbench.report.verify_console import render_verify

    outputs.write("results", save, result, target)
    result = scrub(result)  # what is shown and drawn, as what was written
    render_verify(result, out)
    if "results" not in outputs.failed:
        out.print(f"results: {target}")
    if plots and result.runs:
        from feedbench.report.verify_plots import write_plots  # matplotlib: only when drawing

        written = outputs.write("plots", write_plots, result, target.parent, target.stem)
        if written:
            out.print("plots: " + ", ".join(str(p) for p in written))


def finish(result: VerifyResult, target: Path, outputs: Outputs) -> None:
    """The exit status: not all written, interrupted, a failed run (a measurement failure), or
    success."""
    from feedbench.verify.run import failure

    outputs.check(result.stopped_by)
    if result.stopped_by == "interrupted":
        err.print("interrupted: partial results written")
        raise typer.Exit(EXIT_INTERRUPTED)
    problem = failure(result)
    if problem:
        raise MeasurementFailed(f"{problem} (partial results in {target})")
