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
    TaskID,
    TextColumn,
    TimeElapsedColumn,
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


ScanPath = Annotated[
    str | None,
    typer.Argument(help="Image tree, .tar shard(s) or directory (default: sample_data/)."),
]


def _scan_config(options: dict):
    """A ScanConfig from a command's options (its ``locals()``): names match the config's fields,
    except ``step_time`` → ``step_s``, ``read_latency`` → ``read_latency_s`` and ``read_ahead`` →
    ``read_ahead_mb``."""
    from feedbench.run import ScanConfig, parse_passes
    from feedbench.stages import parse_stages
    from feedbench.sweep import parse_counts

    renamed = {
        "step_time": "step_s",
        "read_latency": "read_latency_s",
        "read_ahead": "read_ahead_mb",
    }
    fields = ScanConfig.__dataclass_fields__
    kw = {renamed.get(k, k): v for k, v in options.items() if renamed.get(k, k) in fields}
    path = kw.get("path")
    kw.update(
        path=path if path is not None else default_data(),
        stages=parse_stages(kw["stages"]),
        passes=parse_passes(kw["passes"]),
        consumers=parse_counts(kw.get("consumers", "1")),
    )
    return ScanConfig(**kw)


def _write_outputs(result, target: Path, plots: bool) -> None:
    from feedbench import results as res
    from feedbench.render import render_scan

    res.save(result, target)
    render_scan(result, out)
    out.print(f"results: {target}")
    if plots and result.measurements:
        try:
            from feedbench.plots import write_all
        except ImportError:
            return
        written = write_all(result, target.parent, target.stem)
        if written:
            out.print("plots: " + ", ".join(str(p) for p in written))


@app.command()
def scan(
    path: ScanPath = None,
    stages: Annotated[
        str, typer.Option(help="Cumulative stages: read,decode,augment,collate,transfer.")
    ] = "read,decode,augment",
    consumers: Annotated[
        str, typer.Option("--consumers", "-c", help="Consumer counts, e.g. 8 or 1,2,4,8.")
    ] = "1",
    workers: Annotated[
        int | None, typer.Option(help="Loader workers per consumer (default: cores / consumers).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", "-b", help="Per consumer (default 64 or profile).")
    ] = None,
    passes: Annotated[str, typer.Option(help="cold (evicted first), warm, or cold,warm.")] = "cold",
    repeat: Annotated[int, typer.Option(help="Repeats of each measurement (mean ± std).")] = 1,
    profile: Annotated[
        str | None, typer.Option(help="Emulated accelerator, e.g. resnet50-h200.")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(help="Emulated accelerator appetite, samples/s per consumer.")
    ] = None,
    step_time: Annotated[
        float | None, typer.Option("--step-time", help="Emulated step, seconds per batch.")
    ] = None,
    async_steps: Annotated[
        bool, typer.Option(help="Emulated steps not synchronised across consumers.")
    ] = False,
    target_au: Annotated[float, typer.Option(help="Target accelerator utilisation.")] = 0.9,
    find_max: Annotated[
        bool, typer.Option(help="Search the most consumers with AU ≥ target (grow, bisect).")
    ] = False,
    max_consumers: Annotated[
        int | None, typer.Option(help="Upper bound for --find-max (default: 2 × cores, ≥ 8).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto, tree or shards.")] = "auto",
    drop_caches: Annotated[
        bool, typer.Option(help="Also write /proc/sys/vm/drop_caches (root) before cold passes.")
    ] = False,
    direct: Annotated[
        bool, typer.Option(help="Read with O_DIRECT (bypass the page cache).")
    ] = False,
    read_latency: Annotated[
        float, typer.Option(help="Add this many seconds to every file read (emulate slow storage).")
    ] = 0.0,
    read_ahead: Annotated[
        float,
        typer.Option(
            help="Shards: ask the kernel to read this many MiB ahead of each shard's read "
            "position (posix_fadvise WILLNEED), so the disk works while the tar is parsed. "
            "0: the kernel's own read-ahead only."
        ),
    ] = 0.0,
    read_thread: Annotated[
        bool,
        typer.Option(
            help="Local shards, --stages read: a reading thread per shard keeps one 1 MiB read "
            "call in flight while the tar is parsed (read time is then time spent waiting for "
            "storage); --no-read-thread reads in series with the parsing, as pipelines "
            "(--stages read,decode,...) always do. Off with --read-ahead."
        ),
    ] = True,
    warmup_batches: Annotated[
        int, typer.Option(help="Batches per consumer left out of AU and the steady rate.")
    ] = 1,
    seed: Annotated[int, typer.Option(help="Shuffle and augmentation seed.")] = 0,
    loader: Annotated[
        str | None,
        typer.Option(help="Measure a training loader end to end instead: torch, dali or wds."),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Results file (default: results/scan-TIME.json).")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots beside the results file.")] = True,
) -> None:
    """Measure how fast PATH can be iterated by N consumers (emulated GPUs), stage by stage."""
    from feedbench import results as res
    from feedbench.run import scan as run_scan
    from feedbench.run import unusable

    config = _scan_config(locals())
    target = json_out or Path("results") / time.strftime("scan-%Y%m%d-%H%M%S.json")
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    task: list[TaskID] = []

    def on_count(n: int, w: int, total_bytes: int) -> None:
        if not task:
            bar.start()  # only once measuring starts: an early error stays one clean line
        else:
            bar.update(task[-1], visible=False)
        what = f"{n} consumer{'s' if n != 1 else ''} × {w} workers, {'+'.join(config.passes)}"
        task.append(bar.add_task(what, total=total_bytes))

    def on_progress(nbytes: int) -> None:
        if task:
            bar.update(task[-1], completed=nbytes)

    try:
        result = run_scan(
            config,
            on_update=lambda r: res.save(r, target),
            on_count=on_count,
            on_progress=on_progress,
        )
    finally:
        if task:
            bar.stop()
    _write_outputs(result, target, plots)
    problem = unusable(result)
    if problem:
        raise FeedbenchError(problem)
    if result.partial:
        err.print("interrupted: partial results written")
        raise typer.Exit(130)


def torchrun_main() -> None:
    """``torchrun … -m feedbench.consumer PATH [scan options]``: this process is one rank."""
    from feedbench.exit import leave_without_finalizing

    torchrun_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @torchrun_app.command()
    def consumer(
        path: ScanPath = None,
        stages: str = "read,decode,augment",
        workers: int | None = None,
        batch_size: Annotated[int | None, typer.Option("--batch-size", "-b")] = None,
        passes: str = "cold",
        repeat: int = 1,
        profile: str | None = None,
        rate: float | None = None,
        step_time: Annotated[float | None, typer.Option("--step-time")] = None,
        async_steps: bool = False,
        target_au: float = 0.9,
        fmt: Annotated[str, typer.Option("--format")] = "auto",
        drop_caches: bool = False,
        direct: bool = False,
        read_latency: float = 0.0,
        read_ahead: float = 0.0,
        read_thread: bool = True,
        warmup_batches: int = 1,
        seed: int = 0,
        loader: str | None = None,
        json_out: Annotated[Path | None, typer.Option("--json")] = None,
        plots: bool = True,
    ) -> None:
        """One consumer rank under torchrun; rank 0 gathers, renders and writes the results."""
        from feedbench import results as res
        from feedbench.run import run_under_torchrun, unusable

        config = _scan_config(locals())
        target = json_out or Path("results") / time.strftime("scan-%Y%m%d-%H%M%S.json")
        result = run_under_torchrun(config, on_update=lambda r: res.save(r, target))
        if result is not None:
            _write_outputs(result, target, plots)
            problem = unusable(result)  # as for a local scan: written, then one line and exit 2
            if problem:
                raise FeedbenchError(problem)
            if result.partial:
                err.print("interrupted: partial results written")
                leave_without_finalizing(130)
        leave_without_finalizing()  # a torchrun rank, its work written (see the function)

    try:
        torchrun_app()
    except FeedbenchError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        leave_without_finalizing(2)
    except KeyboardInterrupt:  # a rank other than 0, or rank 0 before it had a result
        leave_without_finalizing(130)


@app.command()
def verify(
    data: Annotated[
        str | None,
        typer.Argument(
            help="Image tree, tar shards, or a feedbench sample root (images/ + shards/); "
            "default: sample_data/."
        ),
    ] = None,
    gpus: Annotated[
        str, typer.Option(help="GPU counts, e.g. 1,2 (CPU processes when there is no GPU).")
    ] = "1,2",
    loader: Annotated[
        str | None,
        typer.Option(
            "--loader",
            "-l",
            help="baseline (stock DataLoader), dali-example (DALI as in its ResNet-50 example, "
            "GPU), torch, dali, wds, synthetic (default: baseline + every loader installed).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="resnet50, resnet18 or smallcnn (default: resnet50; smallcnn on CPU)."),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Measured steps per run (default 200; 30 on CPU).")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Warm-up steps, not measured (default 20; 5 on CPU).")
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            "-b",
            help="Per GPU with --scaling weak; global with strong (default 256; 16 on CPU).",
        ),
    ] = None,
    scaling: Annotated[
        str,
        typer.Option(help="weak: fixed batch per GPU; strong: fixed global batch."),
    ] = "weak",
    image_size: Annotated[
        int | None, typer.Option(help="Training resolution (default 224; 64 on CPU).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Loader workers per rank (default: each loader's own)."),
    ] = None,
    loader_option: Annotated[
        list[str] | None,
        typer.Option(
            "--loader-option",
            "-o",
            help="[LOADER:]KEY=VALUE for the library loaders (torch, dali, wds), e.g. "
            "dali:hw_decoder_load=0.99; repeatable. Without LOADER: every loader of the run "
            "that takes KEY.",
        ),
    ] = None,
    stream_priority: Annotated[
        str,
        typer.Option(
            help="normal, or high: train on the GPU's highest-priority CUDA stream, so a GPU "
            "loader's kernels yield to training's."
        ),
    ] = "normal",
    ddp_option: Annotated[
        list[str] | None,
        typer.Option(
            "--ddp-option",
            help="KEY=VALUE for DistributedDataParallel, repeatable: broadcast_buffers, "
            "gradient_as_bucket_view, static_graph (true/false), bucket_cap_mb. Applies to "
            "every run, the synthetic ceiling too.",
        ),
    ] = None,
    compile_mode: Annotated[
        str,
        typer.Option(
            "--compile",
            help="torch.compile the model for every run, the ceiling too: off, default, "
            "reduce-overhead (CUDA graphs) or max-autotune-no-cudagraphs. Compiling happens in "
            "the warm-up steps.",
        ),
    ] = "off",
    cpu_affinity: Annotated[
        str,
        typer.Option(
            help="inherit, or split: pin each rank (its loader threads and workers too) to its "
            "own equal share of the cores this command may use."
        ),
    ] = "inherit",
    device: Annotated[str, typer.Option(help="auto, cuda or cpu.")] = "auto",
    synthetic: Annotated[
        bool, typer.Option(help="Also run synthetic data (on the GPU): the ceiling.")
    ] = True,
    target_au: Annotated[
        float, typer.Option(help="Data-bound when more than 1 − this of a step waits for data.")
    ] = 0.9,
    seed: Annotated[int, typer.Option(help="Shuffle, augmentation and model seed.")] = 0,
    run_timeout: Annotated[
        float, typer.Option(help="Stop a run after this many seconds.")
    ] = 1800.0,
    keep_going: Annotated[
        bool, typer.Option(help="After a failed run, go on with the others (exit 2 at the end).")
    ] = False,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Results file (default: results/verify-TIME.json)."),
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write PNG plots beside the results file.")] = True,
    fail_at_step: Annotated[int | None, typer.Option(hidden=True)] = None,
    fail_rank: Annotated[int | None, typer.Option(hidden=True)] = None,
    sync_each_step: Annotated[
        bool,
        typer.Option(
            hidden=True,
            help="Diagnostic: the host waits for the GPU after taking each batch (what a "
            "paced loader costs, measured on any loader, synthetic included).",
        ),
    ] = False,
) -> None:
    """Train with each loader on 1..N GPUs (DDP, torchrun) and show whether the GPUs stay fed."""
    from feedbench import verify as v
    from feedbench import verify_results as vr

    config = v.VerifyConfig(
        data=data if data is not None else default_data(),
        gpus=v.parse_gpus(gpus),
        loaders=v.parse_list(loader, "--loader") if loader is not None else None,
        synthetic=synthetic,
        model=model,
        steps=steps,
        warmup=warmup,
        batch_size=batch_size,
        scaling=scaling,
        image_size=image_size,
        workers=workers,
        loader_options=tuple(loader_option or ()),
        stream_priority=stream_priority.strip().lower(),
        ddp_options=tuple(ddp_option or ()),
        compile=compile_mode.strip().lower(),
        cpu_affinity=cpu_affinity.strip().lower(),
        sync_each_step=sync_each_step,
        device=device,
        seed=seed,
        target_au=target_au,
        run_timeout_s=run_timeout,
        keep_going=keep_going,
        fail_at_step=fail_at_step,
        fail_rank=fail_rank,
    )
    target = json_out or Path("results") / time.strftime("verify-%Y%m%d-%H%M%S.json")
    status = err.status("planning…")

    def on_run(name: str, g: int, i: int, total: int) -> None:
        status.update(f"run {i + 1}/{total}: {name} on {g}…")

    with status:
        result = v.verify(
            config,
            log_dir=str(target.parent / f"{target.stem}-logs"),
            on_update=lambda r: vr.save(r, target),
            on_run=on_run,
        )
    vr.save(result, target)
    vr.render_verify(result, out)
    out.print(f"results: {target}")
    if plots and result.runs:
        written = vr.write_plots(result, target.parent, target.stem)
        if written:
            out.print("plots: " + ", ".join(str(p) for p in written))
    if result.stopped_by == "interrupted":
        err.print("interrupted: partial results written")
        raise typer.Exit(130)
    problem = v.failure(result)
    if problem:
        raise FeedbenchError(f"{problem} (partial results in {target})")


@app.command()
def compare(
    results: Annotated[
        list[Path], typer.Argument(help="Two or more scan results files (feedbench scan --json).")
    ],
    label: Annotated[
        list[str] | None,
        typer.Option("--label", "-L", help="A name per file, in order (default: the file names)."),
    ] = None,
    pass_name: Annotated[
        str, typer.Option("--pass", help="Which pass to compare: cold (default) or warm.")
    ] = "cold",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the comparison as JSON here.")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(help="Write the scaling curves as a PNG here (default: beside --json)."),
    ] = None,
) -> None:
    """Put several scan results side by side: throughput per consumer count, bottleneck, how many
    GPUs each feeds, which differences are larger than the measurements' spread."""
    from feedbench import compare as cmp_mod
    from feedbench.render import render_compare

    cmp = cmp_mod.compare([str(p) for p in results], label, pass_name.strip().lower())
    render_compare(cmp, out)
    if json_out is not None:
        cmp_mod.save(cmp, json_out)
        out.print(f"comparison: {json_out}")
    target = plot or (json_out.with_suffix(".png") if json_out is not None else None)
    if target is not None:
        from feedbench.plots import compare_plot

        written = compare_plot(cmp, target)
        if written:
            out.print(f"plot: {written}")


@app.command()
def report(
    results: Annotated[Path, typer.Argument(help="A results file of scan, verify or compare.")],
    html: Annotated[
        Path | None,
        typer.Option(help="Also write one self-contained HTML page here (tables and plots)."),
    ] = None,
) -> None:
    """Show a results file again, as the command printed it (and as HTML with --html)."""
    from feedbench import report as rep

    kind, result = rep.load_any(results)
    rep.render(kind, result, out)
    if html is not None:
        written = rep.write_html(kind, result, str(results), html)
        out.print(f"html: {written}")


def main() -> None:
    try:
        app()
    except FeedbenchError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
