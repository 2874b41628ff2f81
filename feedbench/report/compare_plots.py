"""A comparison's figure: the scaling curves of the compared scans (PNG)."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from feedbench.report.compare import Comparison
from feedbench.report.plotting import _OTHER_COLORS, _consumer_axis, new_figure, save_optional

_PALETTE = ["tab:blue", "tab:orange", *_OTHER_COLORS]


def compare_figure(cmp: Comparison) -> Figure | None:
    """Samples/s against consumers, one line per compared scan (mean ± σ over repeats; no bar
    for a single repeat). ``None`` when no scan has a point of the compared pass."""
    lines = [(c.label, sorted(c.points.values(), key=lambda p: p.consumers)) for c in cmp.columns]
    lines = [(label, pts) for label, pts in lines if pts]
    if not lines:
        return None
    fig = new_figure((7.5, 4.8))
    ax = fig.add_subplot(1, 1, 1)
    counts: list[int] = []
    for i, (label, pts) in enumerate(lines):
        xs = [p.consumers for p in pts]
        ys = [p.samples_per_s_mean for p in pts]
        es = [p.samples_per_s_std if p.repeats > 1 else 0.0 for p in pts]
        counts += xs
        color = _PALETTE[i % len(_PALETTE)]
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, color=color, label=label)
    _consumer_axis(ax, counts)
    ax.set_ylabel("samples/s (after warm-up)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(f"feedbench compare — {cmp.pass_name} pass", fontsize=10)
    fig.tight_layout()
    return fig


def compare_plot(cmp: Comparison, path: str | os.PathLike[str]) -> Path | None:
    """:func:`compare_figure` as a PNG at ``path``; ``None`` (and no file) without points."""
    return save_optional(compare_figure(cmp), path)
