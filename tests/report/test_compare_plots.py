"""A comparison's figure, read back from the built Figure: one line per compared scan with its
spread, the accelerators' demand, MB/s below, axes, legend and title; and the written file is a
PNG."""

from __future__ import annotations

import pytest

from feedbench.report import compare as compare_mod
from feedbench.report.compare import Column, Comparison, SystemRow
from feedbench.report.compare_plots import compare_figure, compare_plot
from feedbench.scan.results import CurvePoint
from tests.report.figures import (
    assert_png,
    error_bars,
    legend_labels,
    series,
    texts,
    tick_labels,
)


def _col(label: str, points: dict[int, tuple[float, float, int]], **kw) -> Column:
    pts = {
        n: CurvePoint(n, "cold", reps, mean, sd, mean - sd, mean + sd, sd / mean, mean / 100, None)
        for n, (mean, sd, reps) in points.items()
    }
    base = dict(
        label=label, path=f"{label}.json", host="h", cpus=16, gpus=[], dataset="/d",
        dataset_format="tree", dataset_bytes=1000, dataset_files=10, stages=["read"],
        batch_size=256, image_size=224, cache="cold", accelerator=None, created_utc="",
        partial=False, points=pts,
    )  # fmt: skip
    return Column(**(base | kw))


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
    ax, ax_mb = compare_figure(_comparison(_columns())).axes
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
    assert ax_mb.get_xlabel() == "consumers (emulated GPUs)"
    assert ax.get_ylabel() == "samples/s (after warm-up)"
    assert ax.get_title() == "feedbench compare — cold pass"
    # below: MB/s of the same points (mb_per_s_mean = samples/s ÷ 100 here), same colours
    assert series(ax_mb) == {label: (xs, [y / 100 for y in ys]) for label, (xs, ys) in got.items()}
    assert [ln.get_color() for ln in ax_mb.get_lines()] == colors
    assert ax_mb.get_ylabel() == "MB/s (mean over repeats)" and ax_mb.get_ylim()[0] == 0


def test_a_comparison_read_back_from_its_file_draws_the_same_lines(tmp_path):
    path = tmp_path / "cmp.json"
    cmp = _comparison(_columns())
    compare_mod.save(cmp, path)
    a, _ = compare_figure(cmp).axes
    b, _ = compare_figure(compare_mod.load(path)).axes
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
    ax, _ = compare_figure(_comparison(cols)).axes
    assert list(series(ax)) == [f"s{i}" for i in range(n)]
    colors = [c.lines[0].get_color() for c in ax.containers]
    assert colors[:2] == ["tab:blue", "tab:orange"] and colors[8:] == colors[: n - 8]


def _fed(n: float) -> SystemRow:
    return SystemRow(consumers=2, accelerators_fed=n, accelerators_fed_std=None, target_au=0.9,
                     samples_per_s=None, mb_per_s=None, files_per_s=None, read_p99_ms=None,
                     clients=1, valid_for_sizing=False)  # fmt: skip


def test_the_demand_of_n_accelerators_is_one_line_when_all_emulated_the_same():
    acc = {"accelerator": "h200", "accelerator_samples_per_s": 1000.0}
    cols = [
        _col("nvme", {1: (900.0, 10.0, 3), 4: (3000.0, 30.0, 3)}, system=_fed(2.7), **acc),
        _col("nfs", {1: (500.0, 5.0, 3), 2: (900.0, 9.0, 3)}, system=_fed(0.85), **acc),
    ]
    ax, _ = compare_figure(_comparison(cols)).axes
    demand = "demand of N × h200 (1,000 samples/s each)"
    assert series(ax)[demand] == ([1.0, 2.0, 4.0], [1000.0, 2000.0, 4000.0])  # every count
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == demand]
    assert line.get_linestyle() == "--" and line.get_color() == "black"
    assert legend_labels(ax) == [demand, "nvme", "nfs"]
    assert texts(ax) == ["accelerators fed: nvme 2.7, nfs 0.85"]


def test_each_scan_gets_its_own_demand_line_when_the_accelerators_differ():
    cols = [
        _col(
            "a",
            {1: (900.0, 10.0, 3), 2: (1700.0, 10.0, 3)},
            accelerator="h100",
            accelerator_samples_per_s=800.0,
        ),
        _col("b", {1: (500.0, 5.0, 3)}, accelerator="a100", accelerator_samples_per_s=400.0),
        _col("c", {1: (300.0, 5.0, 3)}),
    ]  # no accelerator emulated: no demand of its own
    ax, _ = compare_figure(_comparison(cols)).axes
    got = {k: v for k, v in series(ax).items() if k.startswith("demand")}
    assert got == {
        "demand of N × a: h100 (800 samples/s each)": ([1.0, 2.0], [800.0, 1600.0]),
        "demand of N × b: a100 (400 samples/s each)": ([1.0, 2.0], [400.0, 800.0]),
    }
    colors = {ln.get_label(): ln.get_color() for ln in ax.get_lines()}
    assert [colors[k] for k in got] == ["tab:blue", "tab:orange"]  # each its scan's colour
    assert texts(ax) == []  # no accelerators fed recorded: no note


def test_without_an_accelerator_there_is_no_demand_line():
    ax, _ = compare_figure(_comparison(_columns())).axes
    assert not [k for k in series(ax) if k.startswith("demand")]


def test_a_label_with_dollars_is_drawn_as_written(tmp_path):
    """A run labelled ``a$^{x$b`` failed the compare figure with a mathtext parse error."""
    cmp = _comparison([_col("a$^{x$b", {1: (100.0, 1.0, 2), 2: (190.0, 2.0, 2)})])
    assert_png(compare_plot(cmp, tmp_path / "c.png"))
    assert legend_labels(compare_figure(cmp).axes[0]) == ["a$^{x$b"]
