"""``feedbench verify`` results: the schema, the numbers computed from it, its rendering and plots.

The file follows the one results convention (:mod:`feedbench.results`): dataclasses ↔ JSON with
``schema_version`` (the same version number), ``kind = "verify"``, written atomically after every
run, so an interrupted or failed verify keeps what was measured. Everything printed or plotted is
computed from a :class:`VerifyResult`; nothing here measures.

Per step (warm-up excluded) each rank records five parts that add up to the step:

``data_wait_s + forward_backward_s + allreduce_s + optimizer_s + other_s = step_s``

``other_s`` is the remainder (loop bookkeeping): its share of the step is reported as
``unaccounted_fraction`` and stays small when the measured parts cover the step. How each part is
timed on GPU and on CPU is in :data:`TIMING` (and copied into every results file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedbench import __version__, results
from feedbench.results import (
    SCHEMA_VERSION,
    DatasetInfo,
    HostInfo,
    MonitorSample,
    Percentiles,
    Timeline,
    percentiles,
)

KIND = "verify"
PARTS = ("data_wait_s", "forward_backward_s", "allreduce_s", "optimizer_s", "other_s")
PART_LABELS = {
    "data_wait_s": "data wait",
    "forward_backward_s": "forward + backward",
    "allreduce_s": "all-reduce (exposed)",
    "optimizer_s": "optimizer",
    "other_s": "other",
}
SYNTHETIC = "synthetic"

TIMING = {
    "step": "from the end of the previous step's optimizer to the end of this one; consecutive "
    "steps share their boundary, so the steps of a rank tile its measured window",
    "data_wait": "from just before next(loader) until the batch is on the device (host→device "
    "copy and normalisation included): on GPU in GPU time between CUDA events on the training "
    "stream, i.e. how long the GPU had nothing to do because the batch was late; on CPU the "
    "host time blocked in next()",
    "forward_backward": "forward + loss (bf16 autocast on GPU) + backward, less the exposed "
    "all-reduce",
    "allreduce": "exposed gradient all-reduce: a DDP comm hook marks each bucket when it is ready "
    "and when its all-reduce completes (CUDA events on GPU, perf_counter on CPU); exposed = "
    "last completion − last bucket ready, the communication that backward could not hide. "
    "allreduce_busy_s is the union of all bucket intervals (mostly overlapped with backward, "
    "so it is not part of the sum)",
    "optimizer": "optimizer.step() + zero_grad()",
    "other": "step − (data wait + forward/backward + exposed all-reduce + optimizer): loop "
    "bookkeeping",
    "sync": "GPU: no synchronisation inside a step; events are read two steps later, so the host "
    "may run up to two steps ahead as in real training; the measured window starts after a "
    "synchronise + barrier and ends with a synchronise. CPU: perf_counter at phase boundaries",
    "images_per_s": "images of all ranks in the measured steps / the longest rank's measured "
    "window",
}


# --- schema ---------------------------------------------------------------------------------------


@dataclass
class StepSeries:
    """One rank's measured steps, column by column (seconds; see :data:`TIMING`)."""

    rank: int
    step: list[int] = field(default_factory=list)  # step number counted from the first warm-up step
    epoch: list[int] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    data_wait_s: list[float] = field(default_factory=list)
    forward_backward_s: list[float] = field(default_factory=list)
    allreduce_s: list[float] = field(default_factory=list)  # exposed (not hidden by backward)
    optimizer_s: list[float] = field(default_factory=list)
    other_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    allreduce_busy_s: list[float] = field(default_factory=list)  # union of bucket intervals
    host_wait_s: list[float] = field(default_factory=list)  # host time blocked in next()
    buckets: list[int] = field(default_factory=list)  # all-reduce buckets seen per step
    warmup_step_s: list[float] = field(default_factory=list)
    window_s: float | None = None  # measured window (None: the rank did not finish it)
    window_start_mono: float | None = None  # time.monotonic() of the window's ends (host clock)
    window_end_mono: float | None = None
    peak_mem_bytes: int | None = None  # torch.cuda.max_memory_allocated (GPU only)
    batches_per_epoch: int | None = None
    workers: int | None = None
    cpus: str | None = None  # the cores this rank ran on (its affinity, e.g. "0-15")
    ddp: str | None = None  # the DDP settings this rank ran with, read back from DDP itself
    compiled: str | None = None  # torch.compile mode of this rank's model (None: eager)
    error: str | None = None


@dataclass
class Breakdown:
    """Mean seconds per measured step over all ranks; the five parts add up to ``step_s``."""

    data_wait_s: float
    forward_backward_s: float
    allreduce_s: float
    optimizer_s: float
    other_s: float
    step_s: float
    allreduce_busy_s: float
    host_wait_s: float
    step: Percentiles | None = None  # distribution of step times (all ranks)


@dataclass
class VerifyRun:
    """One DDP training run: one loader on ``gpus`` ranks."""

    loader: str
    gpus: int  # ranks: GPUs, or CPU processes without CUDA
    per_gpu_batch: int
    global_batch: int
    status: str = "ok"  # ok / failed / interrupted
    error: str | None = None
    source: str | None = None  # what the loader read
    workers: int | None = None  # loader workers per rank
    cpus: list[str] | None = None  # each rank's cores (its CPU affinity), in rank order
    steps: int = 0  # measured steps (the fewest any rank completed)
    warmup_steps: int = 0
    epochs: int = 0  # epochs started (all steps)
    images: int = 0  # measured images, all ranks
    window_s: float = 0.0
    images_per_s: float = 0.0
    breakdown: Breakdown | None = None
    data_wait_fraction: float | None = None  # Σ data wait / Σ step, mean over ranks
    data_wait_fraction_max: float | None = None  # the worst rank
    unaccounted_fraction: float | None = None  # Σ |other| / Σ step: what the parts do not explain
    steps_vs_window: float | None = None  # Σ step_s / window, mean over ranks (≈ 1)
    base_gpus: int | None = None  # the run efficiency is relative to (1 GPU when measured)
    speedup: float | None = None  # images/s ÷ images/s at base_gpus, same loader
    efficiency: float | None = None  # speedup × base_gpus / gpus
    ceiling_fraction: float | None = None  # images/s ÷ synthetic images/s at the same gpus
    gpu_util_percent_mean: float | None = None  # NVML, the run's GPUs, measured window
    gpu_mem_used_bytes_max: int | None = None  # NVML, the run's GPUs
    gpu_sm_clock_mhz_min: float | None = None  # NVML, the run's GPUs, measured window
    gpu_power_w_mean: float | None = None  # NVML, per GPU, the run's GPUs, measured window
    gpu_peak_alloc_bytes: int | None = None  # torch allocator peak, worst rank
    cpu_percent_mean: float | None = None  # psutil, whole machine, measured window
    busy_cores_mean: float | None = None
    total_s: float = 0.0  # launch to exit, start-up and warm-up included
    log: str | None = None  # torchrun's output
    monitor: Timeline | None = None  # the whole run
    window_t_s: list[float] = field(default_factory=list)  # [start, end] on the monitor's clock
    ranks: list[StepSeries] = field(default_factory=list)
    partial: bool = False


@dataclass
class LoaderVerdict:
    loader: str
    text: str
    data_bound_from: int | None = None  # fewest GPUs with data wait > threshold
    gpus: int | None = None  # the largest GPU count measured
    images_per_s: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    ceiling_fraction: float | None = None
    data_wait_fraction: float | None = None


@dataclass
class VerifyResult:
    kind: str
    created_utc: str
    command: list[str]
    config: dict[str, Any]
    host: HostInfo
    dataset: DatasetInfo | None = None
    timing: dict[str, str] = field(default_factory=lambda: dict(TIMING))
    runs: list[VerifyRun] = field(default_factory=list)
    verdicts: list[LoaderVerdict] = field(default_factory=list)
    summary: str | None = None
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    stopped_by: str | None = None  # "failed" / "interrupted" when the verify did not finish
    schema_version: int = SCHEMA_VERSION
    tool_version: str = __version__


# --- save / load ----------------------------------------------------------------------------------


def save(result: VerifyResult, path: str | os.PathLike[str]) -> None:
    results.save(result, path)


def load(path: str | os.PathLike[str]) -> VerifyResult:
    return results.load(path, KIND, VerifyResult)


# --- statistics (pure) ----------------------------------------------------------------------------


def summarize_run(run: VerifyRun) -> VerifyRun:
    """Fill a run's totals, breakdown and fractions from its ranks' step series (in place)."""
    ranks = [r for r in run.ranks if r.step_s]
    if not ranks:
        run.steps, run.images, run.window_s, run.images_per_s = 0, 0, 0.0, 0.0
        run.breakdown = None
        return run
    run.steps = min(len(r.step_s) for r in ranks)
    # a partial run: count only the steps every rank finished, so ranks stay comparable
    cut = run.steps if run.partial or run.status != "ok" else None

    def col(r: StepSeries, name: str) -> list[float]:
        values = getattr(r, name)
        return values[:cut] if cut is not None else values

    run.images = sum(sum(col(r, "images")) for r in ranks)
    windows = [r.window_s for r in ranks if r.window_s is not None and cut is None]
    run.window_s = (
        max(windows) if len(windows) == len(ranks) else max(sum(col(r, "step_s")) for r in ranks)
    )
    run.images_per_s = run.images / run.window_s if run.window_s > 0 else 0.0
    n = sum(len(col(r, "step_s")) for r in ranks)

    def mean(name: str) -> float:
        return sum(sum(col(r, name)) for r in ranks) / n

    steps_all = [x for r in ranks for x in col(r, "step_s")]
    run.breakdown = Breakdown(
        data_wait_s=mean("data_wait_s"),
        forward_backward_s=mean("forward_backward_s"),
        allreduce_s=mean("allreduce_s"),
        optimizer_s=mean("optimizer_s"),
        other_s=mean("other_s"),
        step_s=mean("step_s"),
        allreduce_busy_s=mean("allreduce_busy_s"),
        host_wait_s=mean("host_wait_s"),
        step=percentiles(steps_all),
    )
    fractions = []
    for r in ranks:
        total = sum(col(r, "step_s"))
        fractions.append(sum(col(r, "data_wait_s")) / total if total > 0 else 0.0)
    run.data_wait_fraction = sum(fractions) / len(fractions)
    run.data_wait_fraction_max = max(fractions)
    total = sum(steps_all)
    other = sum(abs(x) for r in ranks for x in col(r, "other_s"))
    run.unaccounted_fraction = other / total if total > 0 else None
    ratios = [
        sum(r.step_s) / r.window_s for r in ranks if r.window_s and cut is None and r.window_s > 0
    ]
    run.steps_vs_window = sum(ratios) / len(ratios) if ratios else None
    peaks = [r.peak_mem_bytes for r in ranks if r.peak_mem_bytes is not None]
    run.gpu_peak_alloc_bytes = max(peaks) if peaks else None
    return run


def window_stats(
    timeline: Timeline | None, start_s: float, end_s: float, gpus: list[int] | None = None
) -> dict[str, float]:
    """CPU and GPU readings of a run's measured window ``[start_s, end_s]`` (monitor clock).

    A sample covers the interval ending at its ``t_s``; samples whose interval overlaps the window
    count, weighted by the overlap. ``gpus``: the NVML indices the run used (default: all).
    """
    if timeline is None or not timeline.samples:
        return {}
    picked: list[tuple[MonitorSample, float]] = []
    prev = 0.0
    for s in timeline.samples:
        overlap = min(s.t_s, end_s) - max(prev, start_s)
        if overlap > 0:
            picked.append((s, overlap))
        prev = s.t_s
    if not picked:  # a window shorter than one reading: the reading nearest its end
        s = min(timeline.samples, key=lambda s: abs(s.t_s - end_s))
        picked = [(s, 1.0)]
    weight = sum(w for _, w in picked)
    out = {
        "cpu_percent_mean": sum(
            (sum(s.cpu_percent) / len(s.cpu_percent) if s.cpu_percent else 0.0) * w
            for s, w in picked
        )
        / weight,
        "busy_cores_mean": sum(sum(s.cpu_percent) / 100 * w for s, w in picked) / weight,
    }

    def used(values: list) -> list:
        if gpus is None:
            return list(values)
        return [values[i] for i in gpus if i < len(values)]

    gpu = [(used(s.gpu_util_percent), w) for s, w in picked if s.gpu_util_percent]
    gpu = [(u, w) for u, w in gpu if u]
    if gpu:
        gw = sum(w for _, w in gpu)
        out["gpu_util_percent_mean"] = sum(sum(u) / len(u) * w for u, w in gpu) / gw
    mem = [m for s, _ in picked for m in used(s.gpu_mem_used_bytes)]
    if mem:
        out["gpu_mem_used_bytes_max"] = float(max(mem))
    clock = [c for s, _ in picked for c in used(s.gpu_sm_clock_mhz)]
    if clock:  # the lowest SM clock of the run's GPUs in the window: throttling shows here
        out["gpu_sm_clock_mhz_min"] = float(min(clock))
    power = [(used(s.gpu_power_w), w) for s, w in picked if s.gpu_power_w]
    power = [(p, w) for p, w in power if p]
    if power:
        pw = sum(w for _, w in power)
        out["gpu_power_w_mean"] = sum(sum(p) / len(p) * w for p, w in power) / pw
    return out


def ok_runs(result: VerifyResult, loader: str | None = None) -> list[VerifyRun]:
    return sorted(
        (
            r
            for r in result.runs
            if r.status == "ok" and r.images_per_s > 0 and (loader is None or r.loader == loader)
        ),
        key=lambda r: r.gpus,
    )


def loaders_in(result: VerifyResult) -> list[str]:
    return list(dict.fromkeys(r.loader for r in result.runs))


def compare(result: VerifyResult, threshold: float | None = None) -> VerifyResult:
    """Efficiency vs the fewest GPUs, fraction of the synthetic ceiling, verdicts and summary."""
    if threshold is None:
        threshold = 1 - float(result.config.get("target_au", 0.9))
    ceiling = {r.gpus: r.images_per_s for r in ok_runs(result, SYNTHETIC)}
    for loader in loaders_in(result):
        runs = ok_runs(result, loader)
        base = runs[0] if runs else None
        for r in (x for x in result.runs if x.loader == loader):
            r.base_gpus = r.speedup = r.efficiency = r.ceiling_fraction = None
            if base is not None and r.images_per_s > 0 and (r.gpus != base.gpus or base.gpus == 1):
                r.base_gpus = base.gpus
                r.speedup = r.images_per_s / base.images_per_s
                r.efficiency = r.speedup * base.gpus / r.gpus
            c = ceiling.get(r.gpus)
            if c and r.images_per_s > 0:
                r.ceiling_fraction = r.images_per_s / c
    unit = str(result.config.get("unit", "GPU"))
    result.verdicts = [_verdict(loader, ok_runs(result, loader), threshold, unit)
                       for loader in loaders_in(result)]  # fmt: skip
    for v in result.verdicts:
        hint = _broadcast_hint(v, result.config, threshold)
        if hint:
            v.text += hint
    result.summary = _summary(result, unit)
    return result


def units(n: int, unit: str) -> str:
    if unit == "GPU":
        return f"{n} GPU" + ("s" if n != 1 else "")
    return f"{n} process" + ("es" if n != 1 else "")


def fmt_wait(x: float) -> str:
    return f"{x:.0%}" if x >= 0.095 else f"{x:.1%}"


def _verdict(loader: str, runs: list[VerifyRun], threshold: float, unit: str) -> LoaderVerdict:
    if not runs:
        return LoaderVerdict(loader, f"{loader}: no complete run")
    first, last = runs[0], runs[-1]
    v = LoaderVerdict(
        loader,
        "",
        gpus=last.gpus,
        images_per_s=last.images_per_s,
        speedup=last.speedup if last is not first else None,
        efficiency=last.efficiency if last is not first else None,
        ceiling_fraction=last.ceiling_fraction,
        data_wait_fraction=last.data_wait_fraction,
    )
    bound = [r for r in runs if (r.data_wait_fraction or 0.0) > threshold]
    v.data_bound_from = bound[0].gpus if bound else None
    scale = []
    if last is not first and last.speedup is not None:
        scale.append(f"{last.speedup:.2f}× on {units(last.gpus, unit)}")
    elif last is first:
        scale.append(f"{last.images_per_s:,.0f} img/s on {units(last.gpus, unit)}")
    if loader == SYNTHETIC:
        if last is not first and last.efficiency is not None:
            scale.append(f"efficiency {last.efficiency:.0%}")
        v.text = f"{loader} (compute + communication ceiling): " + ", ".join(scale)
        return v
    if last.ceiling_fraction is not None:
        scale.append(f"{last.ceiling_fraction:.2f} of the ceiling")
    w_last = last.data_wait_fraction or 0.0
    if bound and bound[0] is first:
        head = (
            f"data-bound from {units(first.gpus, unit)}, "
            f"{fmt_wait(first.data_wait_fraction or 0.0)} of each step waits for data"
        )
        if last is not first:
            head += f" ({fmt_wait(w_last)} at {units(last.gpus, unit)})"
        v.text = f"{loader}: {head}" + ("; " + ", ".join(scale) if scale else "")
    elif bound:
        b = bound[0]
        v.text = (
            f"{loader}: " + ", ".join(scale) + f"; fed at {units(first.gpus, unit)} (data wait "
            f"{fmt_wait(first.data_wait_fraction or 0.0)}), data-bound from "
            f"{units(b.gpus, unit)}: {fmt_wait(b.data_wait_fraction or 0.0)} of each step "
            "waits for data"
        )
    else:
        v.text = f"{loader}: " + ", ".join([*scale, f"data wait {fmt_wait(w_last)}"])
    return v


def _broadcast_hint(v: LoaderVerdict, config: dict, threshold: float) -> str | None:
    """The DALI loader fed (data wait under the threshold) yet short of the ceiling on several
    GPUs, with DDP broadcasting buffers every step: say what that cost where it was measured."""
    ddp = config.get("ddp_options") or {}
    pace = ((config.get("options_per_loader") or {}).get("dali") or {}).get("pace", 1)
    if (
        v.loader != "dali"
        or config.get("device") != "cuda"
        or (v.gpus or 0) < 2
        or ddp.get("broadcast_buffers", True) is not True
        or not pace
        or v.ceiling_fraction is None
        or v.ceiling_fraction >= 0.95
        or (v.data_wait_fraction or 0.0) > threshold
    ):
        return None
    return (
        "; the gap is not data wait: with DDP's per-step buffer broadcast (on here), the loader's "
        "per-step wait for the GPU (pace) cost ~4% on 2 H200s, where broadcast_buffers=False "
        "took it to 0.97 of the ceiling (--ddp-option broadcast_buffers=false; BENCHMARKS.md)"
    )


def _summary(result: VerifyResult, unit: str) -> str | None:
    runs = ok_runs(result)
    if not runs:
        return None
    top = max(r.gpus for r in runs)
    at = sorted(
        (r for r in runs if r.gpus == top and r.loader != SYNTHETIC),
        key=lambda r: -r.images_per_s,
    )
    if not at:
        return None
    parts = []
    for r in at:
        s = f"{r.loader} {r.images_per_s:,.0f} img/s"
        if r.ceiling_fraction is not None:
            s += f" ({r.ceiling_fraction:.2f} of the ceiling)"
        parts.append(s)
    text = f"at {units(top, unit)}: " + " > ".join(parts)
    synth = next((r for r in runs if r.gpus == top and r.loader == SYNTHETIC), None)
    if synth is not None:
        text += f"; ceiling (synthetic) {synth.images_per_s:,.0f} img/s"
    if len(at) > 1:
        best, worst = at[0], at[-1]
        text += f"; {best.loader} is {best.images_per_s / worst.images_per_s:.2f}× {worst.loader}"
    return text


# --- rendering (console, shared helpers with scan) ------------------------------------------------


def _column(table, name: str) -> None:
    if name == "loader":
        table.add_column(name, justify="left", no_wrap=True, min_width=9)
    else:
        table.add_column(name, justify="right")


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1e3:.2f}" if abs(x) < 0.01 else f"{x * 1e3:.1f}"


def unit_plural(unit: str) -> str:
    return "GPUs" if unit == "GPU" else "processes"


def render_verify(result: VerifyResult, console) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from feedbench.render import fmt_bytes, fmt_rate

    table_style: dict[str, Any] = dict(
        box=box.SIMPLE, pad_edge=False, show_edge=False, padding=(0, 1), collapse_padding=True
    )

    cfg = result.config
    unit = cfg.get("unit", "GPU")
    ds = result.dataset
    if ds is not None:
        console.print(
            f"[bold]{ds.path}[/]  {ds.format}, {ds.files:,} files, {fmt_bytes(ds.bytes)}"
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
        + (f", {len(result.host.cuda_devices)} GPU" if result.host.cuda_devices else ", no GPU")
    )
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
        tuned.append(f"{cfg['workers']} loader workers / DALI threads per rank")
    if tuned:
        console.print("settings: " + "; ".join(escape(t) for t in tuned))
    order = loaders_in(result)
    runs = sorted(result.runs, key=lambda r: (order.index(r.loader), r.gpus))

    def name(r: VerifyRun) -> str:
        return r.loader + ("" if r.status == "ok" else f" [red]({r.status})[/]")

    table = Table(title="DDP training throughput", title_justify="left", **table_style)
    for col in ("loader", "N", "batch", "img/s", "speedup", "effic", "ceil", "wait", "GPU%",
                "GPU mem", "CPU"):  # fmt: skip
        _column(table, col)
    for r in runs:
        mem = r.gpu_mem_used_bytes_max or r.gpu_peak_alloc_bytes
        table.add_row(
            name(r),
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
    console.print(table)
    steps = Table(
        title="step time, ms (mean per step over ranks)",
        title_justify="left",
        **table_style,
    )
    for col in ("loader", "N", "step", "data", "fwd+bwd", "reduce", "busy", "optim", "other",
                "p95"):  # fmt: skip
        _column(steps, col)
    for r in runs:
        b = r.breakdown
        if b is None:
            steps.add_row(name(r), str(r.gpus), *(["—"] * 8))
            continue
        ms = [b.step_s, b.data_wait_s, b.forward_backward_s, b.allreduce_s, b.allreduce_busy_s,
              b.optimizer_s, b.other_s, b.step.p95_s if b.step else None]  # fmt: skip
        steps.add_row(name(r), str(r.gpus), *(fmt_ms(x) for x in ms))
    console.print(steps)
    console.print(
        f"  N: {unit_plural(unit)}; wait: share of the step waiting for data; effic: img/s(N) ÷ "
        f"(N × img/s at the fewest {unit_plural(unit)}); ceil: img/s ÷ synthetic img/s at the "
        "same N. Step = data + fwd+bwd + reduce (all-reduce not hidden by backward) + optim + "
        "other; busy: all the all-reduce time, mostly overlapped with backward (not in the sum)."
    )
    for v in result.verdicts:
        console.print(f"[bold]{v.loader}:[/] {v.text.split(': ', 1)[-1]}")
    if result.summary:
        console.print(f"[bold]summary:[/] {result.summary}")
    for r in result.runs:
        if r.error:
            console.print(f"[red]{r.status}:[/] {escape(r.error)}", highlight=False)
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    if result.partial:
        console.print("[red]partial results: the verify run was interrupted or failed[/]")


# --- plots ----------------------------------------------------------------------------------------

_COLORS = {
    SYNTHETIC: "black",
    "baseline": "tab:red",
    "dali-example": "tab:orange",
    "torch": "tab:blue",
    "dali": "tab:green",
    "wds": "tab:purple",
}
_PART_COLORS = {
    "data_wait_s": "tab:red",
    "forward_backward_s": "tab:blue",
    "allreduce_s": "tab:orange",
    "optimizer_s": "tab:green",
    "other_s": "tab:gray",
}


def _title(result: VerifyResult, what: str) -> str:
    cfg = result.config
    partial = " (partial)" if result.partial else ""
    return (
        f"{what}{partial}\n{cfg.get('model')} {cfg.get('precision')}, {cfg.get('scaling')} "
        f"scaling, batch {cfg.get('batch_size')}, on {result.host.hostname}"
    )


def scaling_plot(result: VerifyResult, path: str | os.PathLike[str]) -> Path | None:
    """Images/s against GPUs per loader, with each loader's ideal line (N × its fewest-GPU rate)."""
    from matplotlib.figure import Figure

    from feedbench.plots import _save

    runs = ok_runs(result)
    if not runs:
        return None
    unit = result.config.get("unit", "GPU")
    counts = sorted({r.gpus for r in runs})
    fig = Figure(figsize=(8.5, 5.5))
    ax = fig.subplots(1, 1)
    for i, loader in enumerate(loaders_in(result)):
        rs = ok_runs(result, loader)
        if not rs:
            continue
        color = _COLORS.get(loader, f"C{i}")
        xs = [r.gpus for r in rs]
        ax.plot(
            xs,
            [r.images_per_s for r in rs],
            marker="o",
            color=color,
            linewidth=2.2 if loader == SYNTHETIC else 1.5,
            label=f"{loader} (ceiling)" if loader == SYNTHETIC else loader,
        )
        base = rs[0]
        ax.plot(
            counts,
            [base.images_per_s * n / base.gpus for n in counts],
            linestyle=":",
            color=color,
            alpha=0.6,
        )
        for r in rs:
            if r.data_wait_fraction is not None and loader != SYNTHETIC:
                ax.annotate(
                    f"wait {fmt_wait(r.data_wait_fraction)}",
                    (r.gpus, r.images_per_s),
                    textcoords="offset points",
                    xytext=(6, -12),
                    fontsize=7,
                    color=color,
                )
    ax.plot(
        [],
        [],
        linestyle=":",
        color="gray",
        label=f"ideal: N × rate at the fewest {unit_plural(unit)}",
    )
    ax.set_xticks(counts)
    ax.set_xticklabels([str(c) for c in counts])
    ax.set_xlabel(f"{unit_plural(unit)} (DDP ranks)")
    ax.set_ylabel("training throughput (images/s, all ranks)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(_title(result, f"DDP training throughput vs {unit_plural(unit)}"), fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def breakdown_plot(result: VerifyResult, path: str | os.PathLike[str]) -> Path | None:
    """Stacked step-time breakdown (ms per step) for every run with steps."""
    from matplotlib.figure import Figure

    from feedbench.plots import _save

    order = loaders_in(result)
    runs = sorted(
        (r for r in result.runs if r.breakdown is not None),
        key=lambda r: (order.index(r.loader), r.gpus),
    )
    if not runs:
        return None
    unit = result.config.get("unit", "GPU")
    fig_h = 2.2 + 0.45 * len(runs)
    fig = Figure(figsize=(9, fig_h))
    ax = fig.subplots(1, 1)
    labels = [f"{r.loader}, {units(r.gpus, unit)}" + ("" if r.status == "ok" else " *")
              for r in runs]  # fmt: skip
    y = list(range(len(runs)))[::-1]
    left = [0.0] * len(runs)
    for part in PARTS:
        widths = [max(0.0, getattr(r.breakdown, part)) * 1e3 for r in runs]
        ax.barh(y, widths, left=left, color=_PART_COLORS[part], label=PART_LABELS[part])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for yi, r, total in zip(y, runs, left, strict=True):
        if r.data_wait_fraction is not None:
            ax.annotate(
                f"{total:.1f} ms, wait {fmt_wait(r.data_wait_fraction)}",
                (total, yi),
                textcoords="offset points",
                xytext=(4, -3),
                fontsize=7,
            )
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("mean time per step (ms)")
    ax.set_xlim(0, max(left) * 1.3 if max(left) > 0 else 1)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(
        fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.55 / max(0.8, fig_h - 1.7)), ncol=5
    )
    ax.set_title(_title(result, "Where each training step goes"), fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def write_plots(result: VerifyResult, directory: str | os.PathLike[str], stem: str) -> list[Path]:
    out = Path(directory)
    written = [
        scaling_plot(result, out / f"{stem}-scaling.png"),
        breakdown_plot(result, out / f"{stem}-breakdown.png"),
    ]
    return [p for p in written if p is not None]
