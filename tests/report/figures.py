"""Reading a built matplotlib Figure back: its series, error bars, legend; and checking a PNG."""

from __future__ import annotations

from matplotlib.container import ErrorbarContainer
from PIL import Image

Series = tuple[list[float], list[float]]


def series(ax) -> dict[str, Series]:
    """Every labelled line of ``ax`` (lines the figure left unlabelled are skipped) and every
    error-bar series (by its legend label, the mean line), as (xs, ys). A label twice fails."""
    out: dict[str, Series] = {}

    def add(label: str, line) -> None:
        assert label not in out, f"two series labelled {label!r}"
        out[label] = ([float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()])

    for line in ax.get_lines():
        label = line.get_label()
        if not (label.startswith("_child") or label == "_nolegend_"):
            add(label, line)
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            add(c.get_label(), c.lines[0])
    return out


def error_bars(ax, label: str) -> tuple[list[float], list[float], list[float]]:
    """(xs, lows, highs) of the vertical error bars of the error-bar series ``label``."""
    (c,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.get_label() == label]
    (bars,) = c.lines[2]
    segments = bars.get_segments()
    return (
        [float(s[0][0]) for s in segments],
        [float(s[0][1]) for s in segments],
        [float(s[1][1]) for s in segments],
    )


def legend_labels(ax) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None, "no legend"
    return [t.get_text() for t in legend.get_texts()]


def tick_labels(ax, axis: str = "x") -> list[str]:
    ticks = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in ticks]


def minor_tick_labels(ax, axis: str = "y") -> list[str]:
    ticks = ax.get_yminorticklabels() if axis == "y" else ax.get_xminorticklabels()
    return [t.get_text() for t in ticks]


def texts(ax) -> list[str]:
    """The annotations and texts drawn on ``ax``, in drawing order."""
    return [t.get_text() for t in ax.texts]


def assert_png(path) -> None:
    assert path.is_file() and path.stat().st_size > 0
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.size[0] > 300 and img.size[1] > 300
        img.verify()
