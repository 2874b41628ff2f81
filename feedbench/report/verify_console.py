"""A verify's results as rich tables and sentences."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from feedbench.report.fmt import count, fmt_bytes, fmt_ms, fmt_rate, plain, shown
from feedbench.report.tables import print_table
from feedbench.verify.analysis import loaders_in
from feedbench.verify.results import (
    PART_COLUMNS,
    PARTS,
    VerifyResult,
    VerifyRun,
    fmt_wait,
    unit_plural,
    units,
)

_TABLE_STYLE: dict[str, Any] = dict(
    box=box.SIMPLE, pad_edge=False, show_edge=False, padding=(0, 1), collapse_padding=True
)


def render_verify(result: VerifyResult, console: Console) -> None:
    """The setup, the throughput and step-time tables, then verdicts, errors and warnings."""
    result = shown(result)  # names from the data: one line each, never markup
    unit = result.config.get("unit", "GPU")
    _print_setup(result, console)
    settings = tuned_settings(result.config)
    if settings:
        console.print("settings: " + "; ".join(plain(t) for t in settings))
    order = loaders_in(result)
    runs = sorted(result.runs, key=lambda r: (order.index(r.loader), r.gpus))
    chosen = ran_with(runs, unit)
    if chosen:
        console.print("loaders ran with: " + "; ".join(plain(t) for t in chosen))
    print_table(console, _throughput_table(runs))
    print_table(console, _step_table(runs))
    _print_sentences(result, unit, console)


def _print_setup(result: VerifyResult, console: Console) -> None:
    """The dataset, then the model, scaling, steps and host in one line."""
    cfg = result.config
    unit = cfg.get("unit", "GPU")
    ds = result.dataset
    if ds is not None:
        console.print(
            f"[bold]{plain(ds.path)}[/]  {plain(ds.format)}, {ds.files:,} files, "
            f"{fmt_bytes(ds.bytes)}"
            + (f", {ds.samples:,} samples" if ds.samples is not None else "")
        )
    console.print(
        f"model {cfg.get('model')} at {cfg.get('image_size')} px on {cfg.get('device')} "
        f"({cfg.get('backend')}, {cfg.get('precision')}); {cfg.get('scaling')} scaling: "
        + (
            f"batch {cfg.get('batch_size')} per {unit} at every count"
            if cfg.get("scaling") == "weak"
            else f"global batch {cfg.get('batch_size')} split over the {unit_plural(unit)}"
        )
        + f"; {cfg.get('steps')} measured steps after {cfg.get('warmup')} warm-up; "
        f"host {result.host.hostname}: {result.host.cpu_count} cores"
        + (f", {len(result.host.cuda_devices)} GPU" if result.host.cuda_devices else ", no GPU"),
        markup=False,
    )


def tuned_settings(cfg: dict[str, Any]) -> list[str]:
    """Each setting that differs from the defaults, in words (unescaped)."""
    tuned = [
        f"{name}: " + ", ".join(f"{k}={v}" for k, v in opts.items())
        for name, opts in (cfg.get("options_per_loader") or {}).items()
    ]
    if cfg.get("stream_priority", "normal") != "normal":
        tuned.append(f"training on the {cfg['stream_priority']}-priority CUDA stream")
    if cfg.get("compile", "off") != "off":
        tuned.append(f"model compiled (torch.compile, {cfg['compile']})")
    if cfg.get("ddp_options"):
        tuned.append("DDP " + ", ".join(f"{k}={v}" for k, v in cfg["ddp_options"].items()))
    if cfg.get("sync_each_step"):
        tuned.append("the host waits for the GPU after taking each batch (diagnostic)")
    if cfg.get("cpu_affinity", "inherit") == "split":
        tuned.append("each rank pinned to its own share of the cores")
    if cfg.get("workers") is not None:
        tuned.append(f"{count(cfg['workers'], 'loader worker')} (DALI: threads) per rank")
    return tuned


def ran_with(runs: list[VerifyRun], unit: str) -> list[str]:
    """What each library loader chose (its ``loader_settings``: where it decoded, its workers
    and their cores), once per loader, or per rank count where those differ (unescaped)."""
    seen: dict[str, dict[str, list[int]]] = {}
    for r in runs:
        if r.loader_settings:
            seen.setdefault(r.loader, {}).setdefault(r.loader_settings, []).append(r.gpus)
    out = []
    for loader, by_text in seen.items():
        if len(by_text) == 1:
            out.append(f"{loader}: {next(iter(by_text))}")
            continue
        for text, gpus in by_text.items():
            many = f"{', '.join(map(str, gpus))} {unit_plural(unit)}"
            out.append(f"{loader} on {units(gpus[0], unit) if len(gpus) == 1 else many}: {text}")
    return out


def _column(table: Table, name: str) -> None:
    """Numbers never wrap or cut; the loader's name (with its status) is the text that wraps."""
    if name == "loader":
        table.add_column(name, justify="left", overflow="fold", min_width=9)
    else:
        table.add_column(name, justify="right", no_wrap=True)


def _name(r: VerifyRun) -> str:
    return plain(r.loader) + ("" if r.status == "ok" else f" [red]({plain(r.status)})[/]")


def _throughput_table(runs: list[VerifyRun]) -> Table:
    """One row per run: images/s, speedup, efficiency, ceiling, data wait, GPU and CPU use."""
    table = Table(title="DDP training throughput", title_justify="left", **_TABLE_STYLE)
    for col in ("loader", "N", "batch", "img/s", "speedup", "effic", "ceil", "wait", "GPU%",
                "GPU mem", "CPU"):  # fmt: skip
        _column(table, col)
    for r in runs:
        mem = r.gpu_mem_used_bytes_max or r.gpu_peak_alloc_bytes
        table.add_row(
            _name(r),
            str(r.gpus),
            f"{r.per_gpu_batch}×{r.gpus}",
            fmt_rate(r.images_per_s) if r.images_per_s else "—",
            f"{r.speedup:.2f}×" if r.speedup is not None else "—",
            f"{r.efficiency:.0%}" if r.efficiency is not None else "—",
            f"{r.ceiling_fraction:.2f}" if r.ceiling_fraction is not None else "—",
            fmt_wait(r.data_wait_fraction) if r.data_wait_fraction is not None else "—",
            f"{r.gpu_util_percent_mean:.0f}%" if r.gpu_util_percent_mean is not None else "—",
            fmt_bytes(mem) if mem else "—",
            f"{r.busy_cores_mean:.1f}" if r.busy_cores_mean is not None else "—",
        )
    return table


def _step_table(runs: list[VerifyRun]) -> Table:
    """One row per run: the mean step and its parts in ms, and the 95th percentile step."""
    table = Table(
        title="step time, ms (mean per step over ranks)", title_justify="left", **_TABLE_STYLE
    )
    for col in ("loader", "N", "step", *PART_COLUMNS.values(), "busy", "p95", "slower"):
        _column(table, col)
    for r in runs:
        b = r.breakdown
        if b is None:
            table.add_row(_name(r), str(r.gpus), *(["—"] * (len(PARTS) + 4)))
            continue
        ms = [b.step_s, *(getattr(b, p) for p in PARTS), b.allreduce_busy_s,
              b.step.p95_s if b.step else None]  # fmt: skip
        slower = f"{r.slowdown_s * 1e3:+.1f}" if r.slowdown_s is not None else "—"
        table.add_row(_name(r), str(r.gpus), *(fmt_ms(x) for x in ms), slower)
    return table


def _print_sentences(result: VerifyResult, unit: str, console: Console) -> None:
    """What the columns mean, the verdicts and summary, then errors, warnings and partial."""
    console.print(
        f"  N: {unit_plural(unit)}; wait: share of the step waiting for data; effic: img/s(N) ÷ "
        f"(N × img/s at the fewest {unit_plural(unit)}); ceil: img/s ÷ synthetic img/s at the "
        "same N. Step = data + fwd+bwd + reduce (all-reduce not hidden by backward) + optim + "
        "other; busy: all the all-reduce time, mostly overlapped with backward (not in the sum); "
        "slower: the step less its data wait, minus the synthetic ceiling's (a loader that slows "
        "the training it feeds)."
    )
    for v in result.verdicts:
        console.print(f"[bold]{plain(v.loader)}:[/] {plain(v.text.split(': ', 1)[-1])}")
    if result.summary:
        console.print(f"[bold]summary:[/] {plain(result.summary)}")
    for r in result.runs:
        if r.error:
            console.print(f"[red]{plain(r.status)}:[/] {plain(r.error)}", highlight=False)
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {plain(w)}", highlight=False)
    if result.partial:
        console.print("[red]partial results: the verify run was interrupted or failed[/]")
