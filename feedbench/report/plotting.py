"""What every figure shares: the Agg canvas, colours, the consumer axis, atomic PNG writing.

Figures are drawn on the Agg canvas directly (no pyplot, no display, no global backend switch)
and written atomically. Each figure has a builder (``*_figure``) that returns the
:class:`~matplotlib.figure.Figure`, so its axes, series and labels can be read back, and a writer
(``*_plot``) that saves it and returns the path written. Both return ``None`` when the results
hold nothing for that figure (then nothing is written).
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from feedbench.core.files import write_atomic
from feedbench.report.fmt import shown

_DPI = 110

_PASS_COLORS = {"cold": "tab:blue", "warm": "tab:orange"}

_OTHER_COLORS = ["tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray"]

_STAGE_COLORS = {
    "read": "tab:blue",
    "decode": "tab:orange",
    "augment": "tab:green",
    "collate": "tab:red",
    "transfer": "tab:purple",
    "transfer-pinned": "tab:purple",
    "transfer-pageable": "tab:brown",
}

_PASS_STYLES = ["-", "--", ":", "-."]


def _pass_color(name: str, order: list[str]) -> str:
    if name in _PASS_COLORS:
        return _PASS_COLORS[name]
    others = [p for p in order if p not in _PASS_COLORS]
    return _OTHER_COLORS[others.index(name) % len(_OTHER_COLORS)] if name in others else "black"


def _pass_order(names: list[str]) -> list[str]:
    """cold, warm, then any other pass names in the order first seen."""
    seen = list(dict.fromkeys(names))
    return [p for p in _PASS_COLORS if p in seen] + [p for p in seen if p not in _PASS_COLORS]


def _log_consumers(counts: list[int]) -> bool:
    """Whether the consumer counts span enough (×16) for a log₂ axis."""
    return bool(counts) and min(counts) > 0 and max(counts) / min(counts) >= 16


class PlainLogFormatter(LogFormatter):
    """A log axis's labels as plain numbers ("1,000", not 10³): the figures draw with mathtext
    off (:func:`text_as_written`), where the default's ``$\\mathdefault{10^{3}}$`` would show as
    its source text."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:,.0f}" if abs(x) >= 1 else f"{x:.2g}"


def log_y(ax) -> None:
    """A log y axis labelled in plain numbers, the minor ticks too where a decade is short."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PlainLogFormatter())
    ax.yaxis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


def _consumer_axis(ax, counts: list[int]) -> None:
    counts = sorted(set(counts))
    if _log_consumers(counts):
        ax.set_xscale("log", base=2)
    ax.set_xticks(counts)
    ax.set_xticklabels([str(c) for c in counts])
    ax.minorticks_off()
    ax.set_xlabel("consumers (emulated GPUs)")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


Builder = TypeVar("Builder", bound=Callable[..., Any])


def text_as_written(build: Builder) -> Builder:
    """A figure builder whose text from the data shows as written: mathtext off (a ``$`` in a
    path or a label is a dollar, and two of them no longer fail the figure with a parse error)
    and control characters escaped as in every other output (:func:`~feedbench.report.fmt.shown`).
    Text objects take the setting when made, so the whole build runs inside it."""

    @functools.wraps(build)
    def built(data: Any, *args: Any, **kwargs: Any) -> Any:
        with matplotlib.rc_context({"text.parse_math": False}):
            return build(shown(data), *args, **kwargs)

    return built  # type: ignore[return-value]


def new_figure(figsize: tuple[float, float]) -> Figure:
    """An empty figure on the Agg canvas."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def save_optional(fig: Figure | None, path: str | os.PathLike[str]) -> Path | None:
    """``save_png`` for a built figure; ``None`` (and no file) for none."""
    return save_png(fig, path) if fig is not None else None


def save_png(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write the figure as a PNG, atomically; return the path."""
    FigureCanvasAgg(fig)
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=_DPI)
    write_atomic(path, data.getvalue())
    return Path(path)
