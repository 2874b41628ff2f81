"""A comparison's figure, read back from the built Figure: one line per compared scan with its
spread, axes, legend and title; and the written file is a PNG."""

from __future__ import annotations

import pytest

from feedbench.report import compare as compare_mod
from feedbench.report.compare import Column, Comparison
from feedbench.report.compare_plots import compare_figure, compare_plot
from feedbench.scan.results import CurvePoint
from tests.report.figures import assert_png, error_bars, legend_labels, series, tick_labels


def _col(label: str, points: dict[int, tuple[float, float, int]]) -> Column:
    pts = {
        n: CurvePoint(n, "cold", reps, mean, sd, mean - sd, mean + sd, sd / mean, mean / 100, None)
        for n, (mean, sd, reps) in points.items()
    }
    return Column(
        label=label, path=f"{label}.json", host="h", cpus=16, gpus=[], dataset="/d",
        dataset_format="tree", dataset_bytes=1000, dataset_files=10, stages=["read"],
        batch_size=256, image_size=224, cache="cold", accelerator=None, created_utc="",
        partial=False, points=pts,
    )  # fmt: skip


def _comparison(columns: list[Column]) -> Comparison:
    counts = sorted({n for c in columns for n in c.points})
    return Comparison(
        kind="compare",
        created_utc="2025-01-01T00:00:00+00:00",
        command=["feedbench", "compare"],
        config={},
        pass_name="cold",
        columns=columns,
        counts=counts,
        common_counts=[n for n in counts if all(n in c.points for c in columns)],
    )


def _columns() -> list[Column]:
    return [
        _col("nvme", {4: (3500.0, 30.0, 3), 1: (1000.0, 10.0, 3), 2: (1900.0, 20.0, 3)}),
        _col("nfs", {1: (900.0, 10.0, 3), 2: (1800.0, 100.0, 3)}),
        _col("empty", {}),  # measured another pass only: no line
        _col("s3", {1: (500.0, 5.0, 1), 8: (3000.0, 40.0, 1)}),  # one repeat: no spread shown
    ]


def test_one_line_per_scan_with_its_spread():
    (ax,) = compare_figure(_comparison(_columns())).axes
    got = series(ax)
    assert got == {
        "nvme": ([1.0, 2.0, 4.0], [1000.0, 1900.0, 3500.0]),
        "nfs": ([1.0, 2.0], [900.0, 1800.0]),
        "s3": ([1.0, 8.0], [500.0, 3000.0]),
    }
    assert error_bars(ax, "nvme") == ([1.0, 2.0, 4.0], [990.0, 1880.0, 3470.0],
                                      [1010.0, 1920.0, 3530.0])  # fmt: skip
    assert error_bars(ax, "nfs") == ([1.0, 2.0], [890.0, 1700.0], [910.0, 1900.0])
    assert error_bars(ax, "s3") == ([1.0, 8.0], [500.0, 3000.0], [500.0, 3000.0])
    colors = [c.lines[0].get_color() for c in ax.containers]
    assert colors == ["tab:blue", "tab:orange", "tab:green"]
    assert legend_labels(ax) == ["nvme", "nfs", "s3"]
    assert tick_labels(ax) == ["1", "2", "4", "8"]
    assert ax.get_xscale() == "linear" and ax.get_ylim()[0] == 0
    assert ax.get_xlabel() == "consumers (emulated GPUs)"
    assert ax.get_ylabel() == "samples/s (after warm-up)"
    assert ax.get_title() == "feedbench compare — cold pass"


def test_a_comparison_read_back_from_its_file_draws_the_same_lines(tmp_path):
    path = tmp_path / "cmp.json"
    cmp = _comparison(_columns())
    compare_mod.save(cmp, path)
    (a,) = compare_figure(cmp).axes
    (b,) = compare_figure(compare_mod.load(path)).axes
    assert series(b) == series(a)
    assert error_bars(b, "nfs") == error_bars(a, "nfs")


def test_without_points_nothing_is_drawn(tmp_path):
    cmp = _comparison([_col("a", {}), _col("b", {})])
    assert compare_figure(cmp) is None
    assert compare_plot(cmp, tmp_path / "c.png") is None
    assert not (tmp_path / "c.png").exists()


def test_compare_plot_writes_a_png(tmp_path):
    out = compare_plot(_comparison(_columns()), tmp_path / "sub" / "cmp-scaling.png")
    assert out == tmp_path / "sub" / "cmp-scaling.png"
    assert_png(out)


@pytest.mark.parametrize("n", [2, 9])
def test_more_scans_than_colours_still_draw_every_line(n):
    cols = [_col(f"s{i}", {1: (100.0 + i, 1.0, 2)}) for i in range(n)]
    (ax,) = compare_figure(_comparison(cols)).axes
    assert list(series(ax)) == [f"s{i}" for i in range(n)]
    colors = [c.lines[0].get_color() for c in ax.containers]
    assert colors[:2] == ["tab:blue", "tab:orange"] and colors[8:] == colors[: n - 8]
