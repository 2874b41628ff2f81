"""The plan's figure: per pass, the measured points with their spread, the chosen model's curve
with its band, the demand of N accelerators, and the knee where it lies within the projection."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure

from feedbench.project.console import MODELS, held_out_line
from feedbench.project.projection import PassPlan, Plan
from feedbench.report.plotting import new_figure, save_optional, text_as_written


def _pass_axes(ax, p: PassPlan, demand: float | None) -> None:
    ns = [row[0] for row in p.curve]
    ax.fill_between(ns, [r[2] for r in p.curve], [r[3] for r in p.curve], alpha=0.25,
                    color="tab:blue", label="95% band")  # fmt: skip
    ax.plot(ns, [r[1] for r in p.curve], color="tab:blue", label=f"fit: {MODELS[p.chosen]}")
    counts = [int(n) for n in p.points]
    means = [sum(xs) / len(xs) for xs in p.points.values()]
    spread = [[m - min(xs) for m, xs in zip(means, p.points.values(), strict=True)],
              [max(xs) - m for m, xs in zip(means, p.points.values(), strict=True)]]  # fmt: skip
    ax.errorbar(counts, means, yerr=spread, fmt="o", color="black", capsize=3,
                label="measured (mean, min–max)")  # fmt: skip
    if demand is not None:
        ax.plot(ns, [n * demand for n in ns], color="tab:red", linestyle="--",
                label=f"demand of N accelerators ({demand:,.0f}/s each)")  # fmt: skip
    if p.knee is not None and p.knee.value is not None and p.knee.value <= p.reach:
        ax.axvline(p.knee.value, color="tab:green", linestyle=":",
                   label=f"knee N* ≈ {p.knee.value:,.1f}")  # fmt: skip
    if p.held_out is not None:
        ax.axvline(p.held_out.consumers, color="gray", linewidth=0.8, alpha=0.5)
        note = held_out_line(p.held_out).replace(": ", ":\n", 1).replace("; ", "\n")
        ax.text(0.98, 0.02, note, fontsize="x-small", ha="right", va="bottom",
                transform=ax.transAxes)  # fmt: skip
    top = max(max(r[3] for r in p.curve), max(max(xs) for xs in p.points.values()))
    ax.set_ylim(0, top * 1.1)
    ax.set_xlim(0, p.reach)
    ax.set_xlabel("consumers (emulated GPUs)")
    ax.set_ylabel("aggregate samples/s")
    ax.set_title(f"{p.pass_name} pass: projected to {p.reach}")
    ax.legend(fontsize="small", loc="upper left")


@text_as_written
def plan_figure(plan: Plan) -> Figure | None:
    """One axes per fitted pass; None without any."""
    if not plan.passes:
        return None
    fig = new_figure((6.4 * len(plan.passes), 4.6))
    for i, p in enumerate(plan.passes):
        _pass_axes(fig.add_subplot(1, len(plan.passes), i + 1), p, plan.demand)
    fig.tight_layout()
    return fig


def plan_plot(plan: Plan, path: str | os.PathLike[str]) -> Path | None:
    return save_optional(plan_figure(plan), path)
