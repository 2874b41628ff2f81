"""A scan's figures: scaling curve, accelerator utilisation, resource timeline (PNG)."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import PercentFormatter

from feedbench.report.fmt import supported_text
from feedbench.report.plotting import (
    _PASS_STYLES,
    _STAGE_COLORS,
    _consumer_axis,
    _log_consumers,
    _mean,
    _pass_color,
    _pass_order,
    log_y,
    new_figure,
    save_optional,
    text_as_written,
)
from feedbench.scan.results import CurvePoint, Measurement, ScanResult
from feedbench.scan.sizing import stopped_undecided
from feedbench.scan.sweep import curve_points


def _title(result: ScanResult, what: str) -> str:
    path = result.dataset.path
    if len(path) > 70:
        path = path[:30] + "…" + path[-39:]
    partial = " (partial)" if result.partial else ""
    return f"{what}{partial}\n{path} on {result.host.hostname}"


def _by_pass(points: list[CurvePoint]) -> dict[str, list[CurvePoint]]:
    out: dict[str, list[CurvePoint]] = defaultdict(list)
    for p in points:
        out[p.pass_name].append(p)
    order = _pass_order(list(out))
    return {name: sorted(out[name], key=lambda p: p.consumers) for name in order}


def accelerator_rate(result: ScanResult) -> float | None:
    """Samples/s one emulated accelerator consumes, when the result says so."""
    acc = result.accelerator or {}
    rate = acc.get("rate") or acc.get("samples_per_s")
    if isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate):
        return float(rate)
    return None


def _stage_rates(result: ScanResult) -> dict[tuple[str, str], dict[int, float]]:
    """(stage, pass) → consumers → mean over repeats of the stage's own samples_per_s."""
    acc: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m in result.measurements:
        for s in m.stages:
            if s.available and s.samples > 0 and s.samples_per_s > 0:
                acc[(s.name, m.pass_name)][m.consumers].append(s.samples_per_s)
    return {k: {n: _mean(v) for n, v in sorted(d.items())} for k, d in acc.items()}


@text_as_written
def scaling_figure(result: ScanResult) -> Figure | None:
    """Samples/s against consumers, one line per pass (mean ± σ over repeats), with the ideal
    N × throughput(1) and, when the result names an accelerator rate, the N-accelerator demand.
    A second panel shows each stage's own rate when the measurements carry stage stats."""
    points = curve_points(result)
    if not points:
        return None
    stages = _stage_rates(result)
    counts = sorted({p.consumers for p in points})
    fig = new_figure((8.5, 8.5 if stages else 5.5))
    if stages:
        ax, ax_stage = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    else:
        ax, ax_stage = fig.subplots(1, 1), None
    _throughput_panel(ax, result, points, counts)
    if ax_stage is not None:
        _stage_panel(ax_stage, stages, counts)
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("")
    else:
        _consumer_axis(ax, counts)
    fig.tight_layout()
    return fig


def scaling_plot(result: ScanResult, path: str | os.PathLike[str]) -> Path | None:
    """:func:`scaling_figure` as a PNG at ``path``."""
    return save_optional(scaling_figure(result), path)


def _throughput_panel(ax, result: ScanResult, points: list[CurvePoint], counts: list[int]) -> None:
    """Each pass's curve with its ideal line, the accelerator demand, axes, legend and title."""
    passes = _by_pass(points)
    order = list(passes)
    for name, pts in passes.items():
        _pass_lines(ax, name, pts, _pass_color(name, order))
    _not_judged_marks(ax, result, points)
    _demand_line(ax, result, counts)
    ax.set_ylabel("throughput (samples/s, all consumers)")
    if _log_consumers(counts):  # a wide range: log–log keeps the small counts readable
        log_y(ax)
    else:
        ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    has_eff = any(p.efficiency is not None and p.consumers != 1 for p in points)
    has_speedup = any(p.efficiency is None and p.speedup is not None for p in points)
    title = []
    if has_eff:
        title.append("%: efficiency = rate(N) / (N × rate(1)), same workers per consumer")
    if has_speedup:
        title.append("×: speedup = rate(N) / rate(1), the cores shared out")
    ax.legend(fontsize=8, loc="upper left", title="\n".join(title) or None, title_fontsize=7)
    _failed_note(ax, result)
    ax.set_title(_title(result, "Throughput vs consumers"), fontsize=10)


NOT_JUDGED_LABEL = "not judged: too few batches in the window all consumers shared"


def _not_judged_marks(ax, result: ScanResult, points: list[CurvePoint]) -> None:
    """A cross over each point no figure may come from (:attr:`Sizing.not_judged`)."""
    z = result.sizing
    bad = [p for p in points if z is not None and not z.judged(p.consumers, p.pass_name)]
    if bad:
        ax.scatter([p.consumers for p in bad], [p.samples_per_s_mean for p in bad], marker="x",
                   s=90, color="crimson", zorder=5, label=NOT_JUDGED_LABEL)  # fmt: skip


def _failed_note(ax, result: ScanResult) -> None:
    """Measurements that failed are no points; say which, under the curve."""
    failed = [m for m in result.measurements if m.failed]
    if not failed:
        return
    lines = [f"not plotted, failed: {m.consumers} consumer{'s' if m.consumers != 1 else ''}, "
             f"{m.pass_name} (repeat {m.repeat}): {m.failed[:80]}" for m in failed[:3]]  # fmt: skip
    ax.text(0.99, 0.02, "\n".join(lines), transform=ax.transAxes, ha="right", va="bottom",
            fontsize=7, color="crimson")  # fmt: skip


def _pass_lines(ax, name: str, pts: list[CurvePoint], color: str) -> None:
    """One pass: mean ± σ with the efficiency at each point, and its ideal N × rate(1)."""
    xs = [p.consumers for p in pts]
    reps = max(p.repeats for p in pts)
    ax.errorbar(
        xs,
        [p.samples_per_s_mean for p in pts],
        yerr=[p.samples_per_s_std for p in pts],
        marker="o",
        capsize=4,
        color=color,
        label=f"{name} (mean ± σ of {reps} repeats)" if reps > 1 else name,
    )
    for p in pts:
        if p.consumers == 1 or (p.efficiency is None and p.speedup is None):
            continue
        ax.annotate(
            f"{p.efficiency:.0%}" if p.efficiency is not None else f"×{p.speedup:.2f}",
            (p.consumers, p.samples_per_s_mean),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
            color=color,
        )
    base = next((p.samples_per_s_mean for p in pts if p.consumers == 1), None)
    # the ideal only where each consumer had what the one consumer had (the same workers)
    ideal = [p.consumers for p in pts if p.efficiency is not None]
    if base and len(ideal) > 1:
        ax.plot(
            ideal,
            [n * base for n in ideal],
            linestyle=":",
            color=color,
            alpha=0.7,
            label=f"ideal {name}: N × 1-consumer rate",
        )


def _demand_line(ax, result: ScanResult, counts: list[int]) -> None:
    """N × the accelerator's rate, when the result names one."""
    rate = accelerator_rate(result)
    if rate is None:
        return
    profile = (result.accelerator or {}).get("name")
    who = f" ({profile})" if isinstance(profile, str) and profile else ""
    ax.plot(
        counts,
        [n * rate for n in counts],
        linestyle="--",
        color="black",
        linewidth=1,
        label=f"demand of N accelerators{who}: N × {rate:,.0f}/s",
    )


def _stage_panel(ax, stages: dict[tuple[str, str], dict[int, float]], counts: list[int]) -> None:
    """Each stage's own rate against consumers: colour per stage, line style per pass."""
    pass_names = _pass_order([p for _, p in stages])
    for (stage, pass_name), by_n in sorted(stages.items()):
        style = _PASS_STYLES[pass_names.index(pass_name) % len(_PASS_STYLES)]
        ax.plot(
            list(by_n),
            list(by_n.values()),
            marker=".",
            linestyle=style,
            color=_STAGE_COLORS.get(stage, "tab:gray"),
            label=f"{stage}, {pass_name}",
        )
    values = [v for by_n in stages.values() for v in by_n.values() if v > 0]
    if values and max(values) > 20 * min(values):  # log only where rates span decades
        log_y(ax)
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel("samples per busy second\n(one worker, per stage)")
    ax.set_title("Each stage's own rate (samples / time spent in it)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    _stage_legend(ax, sorted({stage for stage, _ in stages}), pass_names)
    _consumer_axis(ax, counts)


def _stage_legend(ax, stage_names: list[str], pass_names: list[str]) -> None:
    """Colours name the stages (in pipeline order); line styles the passes, when several."""
    order = list(_STAGE_COLORS)
    seen = sorted(stage_names, key=lambda n: (order.index(n) if n in order else len(order), n))
    handles = [Line2D([], [], color=_STAGE_COLORS.get(n, "tab:gray"), label=n) for n in seen]
    if len(pass_names) > 1:
        handles += [
            Line2D([], [], color="black", linestyle=_PASS_STYLES[i % 4], label=p)
            for i, p in enumerate(pass_names)
        ]
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


@text_as_written
def au_figure(result: ScanResult, target: float = 0.9) -> Figure | None:
    """AU mean and minimum over consumers against consumers, with the target line. ``None`` when
    no point has an AU, i.e. no accelerator step was emulated."""
    points = [p for p in curve_points(result) if p.au_mean is not None or p.au_min is not None]
    if not points:
        return None
    passes = _by_pass(points)
    order = list(passes)
    fig = new_figure((8.5, 5.5))
    ax = fig.subplots(1, 1)
    for name, pts in passes.items():
        _au_lines(ax, name, pts, _pass_color(name, order))
    ax.axhline(target, color="crimson", linewidth=1, label=f"target {target:.0%}")
    supported = result.verdict.supported_consumers if result.verdict else None
    if supported:
        # find-max stopped at a count it could not decide: the answer is a lower bound
        at_least = stopped_undecided(result.config.get("find_max_result"))
        ax.axvline(supported, color="gray", linestyle=":", linewidth=1)
        ax.annotate(
            f"supported: {supported_text(supported, at_least)}",
            (supported, 0.02),
            xycoords=("data", "axes fraction"),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=8,
            color="dimgray",
        )
    ax.set_ylim(0, 1.05)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel("accelerator utilisation (step / (step + wait))")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    acc = result.accelerator or {}
    what = "Accelerator utilisation vs consumers"
    if isinstance(acc.get("name"), str):
        what += f" — {acc['name']}"
    ax.set_title(_title(result, what), fontsize=10)
    _consumer_axis(ax, [p.consumers for p in points])
    fig.tight_layout()
    return fig


def au_plot(result: ScanResult, path: str | os.PathLike[str], target: float = 0.9) -> Path | None:
    """:func:`au_figure` as a PNG at ``path``; ``None`` (and no file) without AU."""
    return save_optional(au_figure(result, target), path)


def _au_lines(ax, name: str, pts: list[CurvePoint], color: str) -> None:
    """One pass: the mean AU over consumers, and the worst consumer's."""
    mean = [(p.consumers, p.au_mean) for p in pts if p.au_mean is not None]
    low = [(p.consumers, p.au_min) for p in pts if p.au_min is not None]
    if mean:
        ax.plot(*zip(*mean, strict=True), marker="o", color=color, label=f"{name}: AU mean")
    if low:
        ax.plot(
            *zip(*low, strict=True),
            marker="v",
            linestyle="--",
            color=color,
            markerfacecolor="none",
            label=f"{name}: AU of the worst consumer",
        )


def _segment_label(m: Measurement) -> str:
    if m.monitor is not None and m.monitor.label:
        return m.monitor.label
    noun = "consumer" if m.consumers == 1 else "consumers"
    return f"{m.consumers} {noun}, {m.pass_name}, repeat {m.repeat}"


@text_as_written
def timeline_figure(result: ScanResult) -> Figure | None:
    """CPU busy cores, disk read MB/s, network MB/s and (with GPU readings) GPU utilisation over
    time, for every measurement with a monitor timeline, one after another. ``None`` when no
    measurement has one. ``fig.axes``: the label strip, then the panels in that order."""
    segments = [m for m in result.measurements if m.monitor is not None and m.monitor.samples]
    if not segments:
        return None
    has_gpu = any(s.gpu_util_percent for m in segments for s in m.monitor.samples)
    rotate = len(segments) > 4
    panels = 4 if has_gpu else 3
    fig = new_figure((11, 2.2 * panels + (2.4 if rotate else 1.5)))
    strip, *axes = fig.subplots(
        panels + 1,
        1,
        sharex=True,
        gridspec_kw={"height_ratios": [0.7 if rotate else 0.15] + [1.0] * panels},
    )
    strip.axis("off")  # a band above the panels for the measurement labels
    pass_names = _pass_order([m.pass_name for m in segments])
    offset = 0.0
    for i, m in enumerate(segments):
        color = _pass_color(m.pass_name, pass_names)
        _segment_series(axes, m, offset, color, has_gpu)
        if i > 0:
            for ax in axes:
                ax.axvline(offset, color="gray", linewidth=0.8, linestyle="--")
        strip.annotate(
            _segment_label(m),
            (offset, 0.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 2),
            textcoords="offset points",
            rotation=90 if rotate else 0,
            ha="left",
            va="bottom",
            fontsize=7,
            color=color,
        )
        offset += m.monitor.samples[-1].t_s
    _timeline_axes(axes, result.host.cpu_count, pass_names, has_gpu, offset)
    fig.suptitle(_title(result, "Resources during the measurements"), fontsize=10)
    fig.tight_layout()
    return fig


def timeline_plot(result: ScanResult, path: str | os.PathLike[str]) -> Path | None:
    """:func:`timeline_figure` as a PNG at ``path``; ``None`` (and no file) without timelines."""
    return save_optional(timeline_figure(result), path)


def _segment_series(axes: list, m: Measurement, offset: float, color: str, has_gpu: bool) -> None:
    """One measurement's readings from ``offset`` on, in every panel; each line is labelled with
    the measurement."""
    samples = m.monitor.samples
    label = _segment_label(m)
    # a value at t_s holds over the interval ending at t_s: steps drawn "pre", from the start
    xs = [offset] + [offset + s.t_s for s in samples]

    def steps(ax, values: list[float]) -> None:
        ax.plot(
            xs,
            [values[0], *values],
            drawstyle="steps-pre",
            color=color,
            linewidth=1.2,
            label=label,
        )

    steps(axes[0], [sum(s.cpu_percent) / 100 for s in samples])
    steps(axes[1], [s.disk_read_bytes_per_s / 1e6 for s in samples])
    steps(axes[2], [s.net_recv_bytes_per_s / 1e6 for s in samples])
    if not has_gpu:
        return
    if all(s.gpu_util_percent for s in samples):
        lo = [min(s.gpu_util_percent) for s in samples]
        hi = [max(s.gpu_util_percent) for s in samples]
        steps(axes[3], [sum(s.gpu_util_percent) / len(s.gpu_util_percent) for s in samples])
        if lo != hi:
            axes[3].fill_between(
                xs, [lo[0], *lo], [hi[0], *hi], step="pre", color=color, alpha=0.2, lw=0
            )
    else:  # GPU readings stopped part-way (see the timeline's note): points only
        gpu = [s for s in samples if s.gpu_util_percent]
        axes[3].plot(
            [offset + s.t_s for s in gpu],
            [sum(s.gpu_util_percent) / len(s.gpu_util_percent) for s in gpu],
            ".",
            color=color,
            label=label,
        )


def _timeline_axes(
    axes: list, cores: int, pass_names: list[str], has_gpu: bool, end_s: float
) -> None:
    """Labels, limits and the CPU panel's legend (a colour per pass, the host's core count)."""
    axes[0].set_ylabel("CPU busy\n(cores)")
    axes[0].set_ylim(0, max(cores, 1) * 1.1)
    axes[0].axhline(cores, color="crimson", linewidth=0.8, linestyle=":")
    axes[0].legend(
        handles=[Line2D([], [], color=_pass_color(p, pass_names), label=p) for p in pass_names]
        + [Line2D([], [], color="crimson", linestyle=":", label=f"{cores} cores")],
        fontsize=7,
        loc="lower right",
        ncol=len(pass_names) + 1,
    )
    axes[1].set_ylabel("disk read\n(MB/s)")
    axes[2].set_ylabel("network in\n(MB/s)")
    if has_gpu:
        axes[3].set_ylabel("GPU util (%)\nmean, band min–max")
        axes[3].set_ylim(0, 105)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.set_xlim(0, end_s)
        if ax is not axes[0]:
            ax.set_ylim(bottom=0)
    axes[-1].set_xlabel("time within each measurement, measurements one after another (s)")


def write_all(
    result: ScanResult, directory: str | os.PathLike[str], stem: str, target: float = 0.9
) -> list[Path]:
    """Every figure that applies, as ``{stem}-scaling.png``, ``{stem}-au.png``,
    ``{stem}-timeline.png`` in ``directory``; returns the paths written."""
    out = Path(directory)
    written = [
        scaling_plot(result, out / f"{stem}-scaling.png"),
        au_plot(result, out / f"{stem}-au.png", target=target),
        timeline_plot(result, out / f"{stem}-timeline.png"),
    ]
    return [p for p in written if p is not None]
