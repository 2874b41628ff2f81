"""A comparison's figure: the compared scans' scaling curves in samples/s, with the accelerators'
demand, and in MB/s below (PNG)."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from feedbench.report.compare import Column, Comparison
from feedbench.report.fmt import fed_text, supported_text
from feedbench.report.plotting import (
    _OTHER_COLORS,
    _consumer_axis,
    new_figure,
    save_optional,
    text_as_written,
)
from feedbench.scan.results import CurvePoint

_PALETTE = ["tab:blue", "tab:orange", *_OTHER_COLORS]

Line = tuple[Column, list[CurvePoint], str]  # a scan, its points in consumer order, its colour


@text_as_written
def compare_figure(cmp: Comparison) -> Figure | None:
    """Top: samples/s against consumers, one line per compared scan (mean ± σ over repeats; no
    bar for a single repeat), and the demand of N accelerators (N × one accelerator's
    samples/s) where the scans emulated one. Bottom: MB/s over the same window. ``None`` when
    no scan has a point of the compared pass."""
    have = [(c, sorted(c.points.values(), key=lambda p: p.consumers)) for c in cmp.columns]
    lines = [(c, pts, _PALETTE[i % len(_PALETTE)]) for i, (c, pts) in
             enumerate((c, pts) for c, pts in have if pts)]  # fmt: skip
    if not lines:
        return None
    fig = new_figure((7.5, 7.6))
    ax, ax_mb = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    counts = sorted({p.consumers for _, pts, _ in lines for p in pts})
    _samples_panel(ax, lines, counts)
    _mb_panel(ax_mb, lines)
    _consumer_axis(ax_mb, counts)
    ax.tick_params(labelbottom=True)
    ax.set_title(f"feedbench compare — {cmp.pass_name} pass", fontsize=10)
    fig.tight_layout()
    return fig


def _samples_panel(ax, lines: list[Line], counts: list[int]) -> None:
    for c, pts, color in lines:
        es = [p.samples_per_s_std if p.repeats > 1 else 0.0 for p in pts]
        ax.errorbar([p.consumers for p in pts], [p.samples_per_s_mean for p in pts], yerr=es,
                    marker="o", capsize=3, color=color, label=c.label)  # fmt: skip
    _demand_lines(ax, lines, counts)
    ax.set_ylabel("samples/s (after warm-up)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def draws_demand(cmp: Comparison) -> bool:
    """Whether :func:`compare_figure` draws the accelerators' demand: a scan with points of
    the compared pass emulated an accelerator."""
    return any(c.accelerator_samples_per_s and c.points for c in cmp.columns)


def _demand_lines(ax, lines: list[Line], counts: list[int]) -> None:
    """N × one accelerator's samples/s: one black line where every scan emulated the same
    accelerator, else one dashed line per scan in its colour. The label says how many each
    system feeds at the target AU."""
    rated = [(c, color) for c, _, color in lines if c.accelerator_samples_per_s]
    shared = len({c.accelerator_samples_per_s for c, _ in rated}) == 1
    for c, color in rated[:1] if shared else rated:
        rate = c.accelerator_samples_per_s
        who = c.accelerator if shared else f"{c.label}: {c.accelerator}"
        ax.plot(counts, [n * rate for n in counts], linestyle="--", linewidth=1,
                color="black" if shared else color,
                label=f"demand of N × {who} ({rate:,.0f} samples/s each)")  # fmt: skip
    fed = [f"{c.label} {fed_text(c.system.accelerators_fed)}" for c, _, _ in lines
           if c.system is not None and c.system.accelerators_fed is not None]  # fmt: skip
    # "≥ N" where find-max stopped at a count it could not decide: a lower bound, not the answer
    found = [f"{c.label} {supported_text(c.supported_consumers, c.supported_at_least)}"
             for c, _, _ in lines
             if c.supported_consumers is not None or c.supported_at_least]  # fmt: skip
    notes = (["accelerators fed: " + ", ".join(fed)] if fed else []) + (
        ["supported consumers: " + ", ".join(found)] if found else []
    )
    if notes:
        ax.text(0.99, 0.02, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom",
                fontsize=8)  # fmt: skip


def _mb_panel(ax, lines: list[Line]) -> None:
    for c, pts, color in lines:
        ax.plot([p.consumers for p in pts], [p.mb_per_s_mean for p in pts], marker="s",
                color=color, label=c.label)  # fmt: skip
    ax.set_ylabel("MB/s (mean over repeats)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def compare_plot(cmp: Comparison, path: str | os.PathLike[str]) -> Path | None:
    """:func:`compare_figure` as a PNG at ``path``; ``None`` (and no file) without points."""
    return save_optional(compare_figure(cmp), path)
