"""A verify's figures: throughput against GPUs, and where each step goes (PNG)."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from feedbench.report.plotting import new_figure, save_optional, text_as_written
from feedbench.verify.analysis import loaders_in, ok_runs
from feedbench.verify.results import (
    PART_LABELS,
    PARTS,
    SYNTHETIC,
    VerifyResult,
    VerifyRun,
    fmt_wait,
    unit_plural,
    units,
)

_COLORS = {
    SYNTHETIC: "black",
    "baseline": "tab:red",
    "dali-example": "tab:orange",
    "torch": "tab:blue",
    "dali": "tab:green",
    "wds": "tab:purple",
}

# one colour per step part, in the order of PARTS
_PART_COLORS = dict(zip(PARTS, ("tab:red", "tab:blue", "tab:orange", "tab:green", "tab:gray"),
                        strict=True))  # fmt: skip


def _title(result: VerifyResult, what: str) -> str:
    cfg = result.config
    partial = " (partial)" if result.partial else ""
    return (
        f"{what}{partial}\n{cfg.get('model')} {cfg.get('precision')}, {cfg.get('scaling')} "
        f"scaling, batch {cfg.get('batch_size')}, on {result.host.hostname}"
    )


@text_as_written
def scaling_figure(result: VerifyResult) -> Figure | None:
    """Images/s against GPUs per loader, with each loader's ideal line (N × its fewest-GPU rate).
    ``None`` when no run finished with a rate."""
    runs = ok_runs(result)
    if not runs:
        return None
    unit = result.config.get("unit", "GPU")
    counts = sorted({r.gpus for r in runs})
    fig = new_figure((8.5, 5.5))
    ax = fig.subplots(1, 1)
    for i, loader in enumerate(loaders_in(result)):
        rs = ok_runs(result, loader)
        if rs:
            _loader_lines(ax, loader, rs, counts, _COLORS.get(loader, f"C{i}"))
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
    return fig


def scaling_plot(result: VerifyResult, path: str | os.PathLike[str]) -> Path | None:
    """:func:`scaling_figure` as a PNG at ``path``; ``None`` (and no file) without a rate."""
    return save_optional(scaling_figure(result), path)


def _loader_lines(ax, loader: str, runs: list[VerifyRun], counts: list[int], color: str) -> None:
    """One loader's images/s with the data wait at each point, and its ideal line over
    ``counts`` (labelled ``_ideal <loader>``: the legend has one entry for all ideal lines).
    The ceiling is drawn as the fractions take it: the mean of its two runs where it ran twice."""
    from feedbench.verify.analysis import ceiling_rate

    ax.plot(
        [r.gpus for r in runs],
        [ceiling_rate(r) if loader == SYNTHETIC else r.images_per_s for r in runs],
        marker="o",
        color=color,
        linewidth=2.2 if loader == SYNTHETIC else 1.5,
        label=f"{loader} (ceiling)" if loader == SYNTHETIC else loader,
    )
    base = runs[0]
    ax.plot(
        counts,
        [
            (ceiling_rate(base) if loader == SYNTHETIC else base.images_per_s) * n / base.gpus
            for n in counts
        ],
        linestyle=":",
        color=color,
        alpha=0.6,
        label=f"_ideal {loader}",
    )
    for r in runs:
        if r.data_wait_fraction is not None and loader != SYNTHETIC:
            ax.annotate(
                f"wait {fmt_wait(r.data_wait_fraction)}",
                (r.gpus, r.images_per_s),
                textcoords="offset points",
                xytext=(6, -12),
                fontsize=7,
                color=color,
            )


@text_as_written
def breakdown_figure(result: VerifyResult) -> Figure | None:
    """Stacked step-time breakdown (ms per step) for every run with steps, one bar per run (the
    first run at the top); ``None`` when no run has a breakdown."""
    order = loaders_in(result)
    runs = sorted(
        (r for r in result.runs if r.breakdown is not None),
        key=lambda r: (order.index(r.loader), r.gpus),
    )
    if not runs:
        return None
    unit = result.config.get("unit", "GPU")
    fig_h = 2.2 + 0.45 * len(runs)
    fig = new_figure((9, fig_h))
    ax = fig.subplots(1, 1)
    labels = [f"{r.loader}, {units(r.gpus, unit)}" + ("" if r.status == "ok" else " *")
              for r in runs]  # fmt: skip
    y = list(range(len(runs)))[::-1]
    totals = _stacked_parts(ax, runs, y)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("mean time per step (ms)")
    ax.set_xlim(0, max(totals) * 1.3 if max(totals) > 0 else 1)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(
        fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.55 / max(0.8, fig_h - 1.7)), ncol=5
    )
    ax.set_title(_title(result, "Where each training step goes"), fontsize=10)
    fig.tight_layout()
    return fig


def breakdown_plot(result: VerifyResult, path: str | os.PathLike[str]) -> Path | None:
    """:func:`breakdown_figure` as a PNG at ``path``; ``None`` (and no file) without steps."""
    return save_optional(breakdown_figure(result), path)


def _stacked_parts(ax, runs: list[VerifyRun], y: list[int]) -> list[float]:
    """One bar segment per part (ms, negative shown as 0) and the step total at each bar's end;
    returns the totals."""
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
    return left


def write_plots(result: VerifyResult, directory: str | os.PathLike[str], stem: str) -> list[Path]:
    """Every figure that applies, as ``{stem}-scaling.png`` and ``{stem}-breakdown.png`` in
    ``directory``; returns the paths written."""
    out = Path(directory)
    written = [
        scaling_plot(result, out / f"{stem}-scaling.png"),
        breakdown_plot(result, out / f"{stem}-breakdown.png"),
    ]
    return [p for p in written if p is not None]
