"""``feedbench scan``: how fast N consumers can iterate the data, stage by stage; and its
torchrun rank, ``feedbench consumer`` (the same options: one consumer per process)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from feedbench.cli import options as o
from feedbench.cli.app import Outputs, app, default_data, err, error_line, out, results_path
from feedbench.core.errors import EXIT_INTERRUPTED, FeedbenchError

Stages = Annotated[
    str, typer.Option(help="Cumulative stages: read,decode,augment,collate,transfer.")
]
Rate = Annotated[
    float | None, typer.Option(help="Emulated accelerator appetite, samples/s per consumer.")
]
StepTime = Annotated[float | None, typer.Option(help="Emulated step, seconds per batch.")]
AsyncSteps = Annotated[bool, typer.Option(help="Emulated steps not synchronised across ranks.")]
FindMax = Annotated[
    bool, typer.Option(help="Search the most consumers with AU ≥ target (grow, then bisect).")
]
MaxConsumers = Annotated[
    int | None, typer.Option(help="Upper bound for --find-max (default: 2 × cores, ≥ 8).")
]
DropCaches = Annotated[
    bool, typer.Option(help="Also write /proc/sys/vm/drop_caches (root) before cold passes.")
]
Direct = Annotated[bool, typer.Option(help="Read with O_DIRECT (bypass the page cache).")]
ReadLatency = Annotated[
    float, typer.Option(help="Add this many seconds to every file read (emulate slow storage).")
]
ReadAhead = Annotated[
    float,
    typer.Option(
        help="Shards: ask the kernel to read this many MiB ahead of each shard's read position "
        "(posix_fadvise WILLNEED). 0: the kernel's own read-ahead only."
    ),
]
ReadThread = Annotated[
    bool,
    typer.Option(
        help="Local shards, --stages read: a reading thread per shard keeps one 1 MiB read call "
        "in flight while the tar is parsed; --no-read-thread reads in series with the parsing, "
        "as pipelines always do. Off with --read-ahead."
    ),
]
StallTimeout = Annotated[
    float,
    typer.Option(
        help="Seconds without a byte read or a batch taken by any consumer (under torchrun: by "
        "one rank, while not waiting for the others) after which the storage counts as stalled: "
        "the measurement is marked failed, every process ended, exit 3."
    ),
]
Loader = Annotated[
    str | None,
    typer.Option(
        help="Measure a training loader end to end instead: torch, dali, wds, auto (ours), or "
        "your own: FILE.py:FUNCTION or MODULE:FUNCTION, a factory called in every consumer with "
        "the keywords it takes among rank, world_size, local_rank, batch_size, workers, seed, "
        "epoch, path, returning an iterable of batches."
    ),
]
LoaderOption = Annotated[
    list[str] | None,
    typer.Option(
        help="KEY=VALUE passed to the loader as one more keyword (repeatable); the value is "
        "read as an int, float, true/false, else a string."
    ),
]
Accelerator = Annotated[
    str | None,
    typer.Option(
        help="With --workload: whose step time, batch, read threads and AU threshold to take "
        "(h100, a100; h200 where measured). Default h100."
    ),
]

Emulate = Annotated[
    str,
    typer.Option(
        help="The emulated accelerator step: gpu runs the profile's model's own training step "
        "(resnet50-h200: ResNet-50), else real kernels of the step's length, from each "
        "consumer's main thread (a loader slowing the step then counts against AU); "
        "sleep only waits (storage-only runs, machines without a GPU); auto: gpu where every "
        "consumer has a GPU of its own, else sleep.",
    ),
]

Describe = Annotated[
    str | None,
    typer.Option(
        help="The system under test in your words (model, configuration, price), recorded in the "
        "results and shown in reports and compare."
    ),
]

Index = Annotated[
    str | None,
    typer.Option(
        help="Tar shards: a loaders' index of them (build_loader(..., index=PATH)); made there "
        "when absent, reading each shard once. A shard cut short then counts the samples it "
        "lost, and the results state the samples expected.",
    ),
]


@app.command(short_help="How fast N consumers can read this data, stage by stage.")
def scan(
    path: o.Data = None,
    stages: Stages = "read,decode,augment",
    consumers: o.Consumers = "1",
    workers: o.Workers = None,
    batch_size: o.BatchSize = None,
    passes: o.Passes = "cold",
    repeat: Annotated[int, typer.Option(help="Repeats of each measurement (mean ± std).")] = 1,
    profile: o.Profile = None,
    rate: Rate = None,
    step_time: StepTime = None,
    async_steps: AsyncSteps = False,
    emulate: Emulate = "auto",
    target_au: o.TargetAu = None,
    find_max: FindMax = False,
    max_consumers: MaxConsumers = None,
    fmt: o.Format = "auto",
    drop_caches: DropCaches = False,
    direct: Direct = False,
    read_latency: ReadLatency = 0.0,
    read_ahead: ReadAhead = 0.0,
    read_thread: ReadThread = True,
    stall_timeout: StallTimeout = 60.0,
    warmup: o.Warmup = None,
    seed: o.Seed = 0,
    loader: Loader = None,
    describe: Describe = None,
    workload: o.Workload = None,
    accelerator: Accelerator = None,
    index: Index = None,
    list_workloads: o.ListWorkloads = False,
    loader_option: LoaderOption = None,
    json_out: o.Json = None,
    plots: o.Plots = True,
    wide: o.Wide = False,
    warmup_batches: o.WarmupAlias = None,
) -> None:
    """Measure how fast PATH can be iterated by N consumers (emulated GPUs), stage by stage.

    --workload takes the format, batch size, read threads (--workers), step time and AU
    threshold of that workload on --accelerator from the workload table (--list-workloads);
    each flag given overrides its part."""
    from feedbench.core.supervise import sigterm_as_interrupt
    from feedbench.scan.run import scan as run_scan

    config = scan_config(locals())
    target = results_path(json_out, "scan")
    progress = _Progress(config.passes)
    outputs = Outputs(target)
    # Ctrl-C, SIGTERM and SIGHUP alike: the measurement stops, its processes end, what was
    # measured is written (partial) and the exit status says interrupted
    with sigterm_as_interrupt() as stop:
        try:
            result = run_scan(
                config,
                on_update=outputs.update,
                on_count=progress.count,
                on_progress=progress.advance,
                on_listing=Listing(err),
            )
        except KeyboardInterrupt:  # before the first measurement ended, or after the last
            progress.stop()
            kept = f"{target} holds what was written" if target.exists() else "nothing written"
            err.print(f"interrupted ({stop.signal or 'SIGINT'}): {kept}")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        finally:
            progress.stop()
        stop.hold()  # a signal now would only cut the writing short
        write_outputs(result, target, plots, outputs, wide)
    end(result, outputs, stop.signal)


def end(result, outputs: Outputs, signal_name: str | None) -> None:
    """The exit status of a written scan: not all written (4), bad data (2), a failed
    measurement (3), interrupted (130), else success."""
    from feedbench.scan.run import outcome

    outputs.check(result.stopped_by)
    problem = outcome(result)
    if problem:
        raise problem
    if result.stopped_by == "interrupted":
        by = f" ({signal_name})" if signal_name else ""
        err.print(f"interrupted{by}: partial results written")
        raise typer.Exit(EXIT_INTERRUPTED)


LISTING_EVERY_S = 2.0  # a listing's progress line at most this often


class Listing:
    """``listing: 120,000 files…`` on stderr while the data's folder is listed, at most every
    ``LISTING_EVERY_S``: a tree of a million files takes tens of seconds, which should not
    pass in silence; a small one prints nothing."""

    def __init__(self, console) -> None:
        self.console = console
        self.every_s = LISTING_EVERY_S
        self.last = time.monotonic()

    def __call__(self, files: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            files_ = f"{files:,} file{'s' if files != 1 else ''}"
            self.console.print(f"listing: {files_}…", highlight=False)


class _Progress:
    """Bytes read so far at the count being measured; shown only once measuring starts, so an
    early error stays one clean line."""

    def __init__(self, passes) -> None:
        self.passes = passes
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_interactive,  # a log or a pipe: no bar, and no empty line at stop
        )
        self.tasks: list[TaskID] = []

    def count(self, n: int, w: int, total_bytes: int) -> None:
        if not self.tasks:
            self.bar.start()
        else:
            self.bar.update(self.tasks[-1], visible=False)
        what = f"{n} consumer{'s' if n != 1 else ''} × {w} workers, {'+'.join(self.passes)}"
        self.tasks.append(self.bar.add_task(what, total=total_bytes))

    def advance(self, nbytes: int) -> None:
        if self.tasks:
            self.bar.update(self.tasks[-1], completed=nbytes)

    def stop(self) -> None:
        if self.tasks:
            self.bar.stop()


# Batch size when PATH is left out (the bundled sample, README set-up command 1): 9 batches of
# its 36 images, so a first run shows a steady rate beside its first batch.
SAMPLE_BATCH = 4


def scan_config(options: dict):
    """A ScanConfig from the command's options (its ``locals()``)."""
    from feedbench.core.choices import parse_counts
    from feedbench.scan.config import ScanConfig, apply_workload, parse_passes, parse_stages
    from feedbench.scan.factory import parse_options

    warmup = options.get("warmup")
    if warmup is None:
        warmup = options.get("warmup_batches")
    renamed = {
        "step_time": "step_s",
        "read_latency": "read_latency_s",
        "read_ahead": "read_ahead_mb",
        "stall_timeout": "stall_timeout_s",
    }
    fields = ScanConfig.__dataclass_fields__
    kw = {renamed.get(k, k): v for k, v in options.items() if renamed.get(k, k) in fields}
    if kw.get("path") is None and kw.get("batch_size") is None and not kw.get("workload"):
        kw["batch_size"] = SAMPLE_BATCH  # the bundled sample is 36 images: 64 is one batch
    kw.update(
        path=kw.get("path") if kw.get("path") is not None else default_data(),
        stages=parse_stages(kw["stages"]),
        passes=parse_passes(kw["passes"]),
        consumers=parse_counts(kw.get("consumers", "1"), "--consumers"),
        warmup_batches=1 if warmup is None else warmup,
        loader_options=parse_options(options.get("loader_option") or ()),
    )
    _check_emulate(kw.get("emulate", "auto"), max(kw["consumers"]))
    given_au = kw.get("target_au") is not None
    if not given_au:
        kw["target_au"] = 0.9
    return apply_workload(ScanConfig(**kw), target_au_given=given_au)


def _check_emulate(mode: str, consumers: int) -> None:
    """``--emulate``: a known mode, and ``gpu`` only where each consumer has a GPU."""
    if mode not in ("auto", "gpu", "sleep"):
        raise FeedbenchError(f"--emulate {mode}: choose auto, gpu or sleep")
    if mode == "gpu":
        import torch

        gpus = torch.cuda.device_count()  # NVML's count: no CUDA context before the fork
        if consumers > gpus:
            raise FeedbenchError(
                f"--emulate gpu needs a GPU per consumer: {consumers} consumer"
                f"{'s' if consumers != 1 else ''}, {gpus} GPU{'s' if gpus != 1 else ''} "
                "here (--emulate sleep runs anywhere)"
            )


def write_outputs(result, target: Path, plots: bool, outputs: Outputs, wide: bool = False) -> None:
    """The results file, the terminal's tables and the plots: each that fits is written (see
    :class:`Outputs`)."""
    from feedbench.core.envelope import save
    from feedbench.core.redact import scrub
    from feedbench.report.scan_console import render_scan

    outputs.write("results", save, result, target)
    result = scrub(result)  # what is shown and drawn, as what was written
    render_scan(result, out, wide)
    if "results" not in outputs.failed:
        out.print(f"results: {target}")
    if plots and result.measurements:
        from feedbench.report.scan_plots import write_all  # matplotlib: only where it draws

        written = outputs.write("plots", write_all, result, target.parent, target.stem)
        if written:
            out.print("plots: " + ", ".join(str(p) for p in written))


@app.command("consumer", hidden=True)
@functools.wraps(scan)
def consumer(**options) -> None:
    """One consumer rank under torchrun (``torchrun ... -m feedbench consumer PATH [scan
    options]``); rank 0 gathers, renders and writes the results."""
    from feedbench.core.supervise import leave_without_finalizing
    from feedbench.scan.factory import is_user_spec, run_exit_handlers
    from feedbench.scan.torchrun import RankLost, run_under_torchrun

    code = 0
    try:
        for name in ("find_max", "max_consumers"):
            if options.get(name):
                raise FeedbenchError(f"--{name.replace('_', '-')}: torchrun sets the world size")
        config = scan_config(options)
        target = results_path(options.get("json_out"), "scan")
        plots = options.get("plots", True)
        wide = options.get("wide", False)
        outputs = Outputs(target)

        def stalled(result, error: FeedbenchError) -> None:  # on the stall watch's thread
            if result is not None:
                write_outputs(result, target, plots, outputs, wide)
            error_line(error)

        result = run_under_torchrun(config, on_update=outputs.update, on_stalled=stalled)
        if result is not None:
            write_outputs(result, target, plots, outputs, wide)
            end(result, outputs, None)  # as for a local scan: written, then one line
    except RankLost as e:  # rank 0 says it
        code = e.code
    except FeedbenchError as e:
        error_line(e)
        code = e.code
    except typer.Exit as e:  # interrupted, said by end()
        code = e.exit_code
    except KeyboardInterrupt:  # a rank other than 0, or rank 0 before it had a result
        code = EXIT_INTERRUPTED
    if is_user_spec(options.get("loader")):
        run_exit_handlers(code)  # the user's loader cleans up there (shared memory, files)
    leave_without_finalizing(code)  # a torchrun rank, its work written (see the function)
