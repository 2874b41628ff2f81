"""A verify's figures, read back from the built Figure: each loader's images/s and ideal line, the
stacked step-time parts, axes, legends and titles; and the written files are PNGs."""

from __future__ import annotations

import pytest

from feedbench.core.envelope import HostInfo
from feedbench.report import verify_plots as plots
from feedbench.verify.results import PART_LABELS, PARTS, Breakdown, VerifyResult, VerifyRun
from tests.report.figures import assert_png, legend_labels, series, texts, tick_labels

TITLE_TAIL = "\nresnet50 bf16, weak scaling, batch 256, on h"


def _result(runs: list[VerifyRun], unit: str = "GPU") -> VerifyResult:
    host = HostInfo("h", "linux", "3.11", 32, 1 << 30, "2", [])
    return VerifyResult(
        kind="verify",
        created_utc="now",
        command=["feedbench"],
        config={
            "unit": unit,
            "target_au": 0.9,
            "model": "resnet50",
            "precision": "bf16",
            "scaling": "weak",
            "batch_size": 256,
        },  # fmt: skip
        host=host,
        runs=runs,
    )


def _breakdown(wait_ms: float, other_ms: float = 1.0) -> Breakdown:
    parts = [wait_ms / 1e3, 0.030, 0.004, 0.002, other_ms / 1e3]
    return Breakdown(*parts, step_s=sum(parts), allreduce_busy_s=0.012, host_wait_s=0.0)


def _run(loader: str, gpus: int, ips: float, wait: float | None, **kw) -> VerifyRun:
    kw.setdefault("breakdown", _breakdown(wait * 50 if wait is not None else 0.0))
    return VerifyRun(loader, gpus, 256, 256 * gpus, images_per_s=ips, data_wait_fraction=wait, **kw)


def _runs() -> list[VerifyRun]:
    return [
        _run("synthetic", 1, 4603, 0.0),
        _run("synthetic", 2, 9190, 0.0),
        _run("synthetic", 4, 18100, 0.0),
        _run("baseline", 1, 2370, 0.49),
        _run("baseline", 2, 2892, 0.65),
        _run("baseline", 4, 0.0, None, status="failed", error="rank 1 died", breakdown=None),
        _run("torch", 2, 9074, 0.008),  # no 1-GPU run: its ideal line starts from 2 GPUs
        _run("torch", 4, 17800, 0.06, breakdown=_breakdown(3.0, other_ms=-0.5)),
        _run("dali", 4, 16000, 0.2, status="interrupted"),  # has steps, but no rate to plot
    ]


# --- scaling ----------------------------------------------------------------------------------


def test_scaling_lines_are_each_loaders_images_per_s_with_its_ideal_line():
    r = _result(_runs())
    (ax,) = plots.scaling_figure(r).axes
    got = series(ax)
    assert got["synthetic (ceiling)"] == ([1.0, 2.0, 4.0], [4603, 9190, 18100])
    assert got["baseline"] == ([1.0, 2.0], [2370, 2892])  # the failed run is not a point
    assert got["torch"] == ([2.0, 4.0], [9074, 17800])
    # ideal: N × the rate at the loader's fewest GPUs, over every GPU count measured
    assert got["_ideal synthetic"] == ([1.0, 2.0, 4.0], pytest.approx([4603, 9206, 18412]))
    assert got["_ideal baseline"] == ([1.0, 2.0, 4.0], pytest.approx([2370, 4740, 9480]))
    assert got["_ideal torch"] == ([1.0, 2.0, 4.0], pytest.approx([4537, 9074, 18148]))
    assert got["ideal: N × rate at the fewest GPUs"] == ([], [])  # the legend's one entry
    assert len(got) == 7  # no dali line: it has no finished run
    assert legend_labels(ax) == [
        "synthetic (ceiling)", "baseline", "torch", "ideal: N × rate at the fewest GPUs",
    ]  # fmt: skip
    assert texts(ax) == ["wait 49%", "wait 65%", "wait 0.8%", "wait 6.0%"]  # not the ceiling's
    (ceiling,) = [ln for ln in ax.get_lines() if ln.get_label() == "synthetic (ceiling)"]
    assert ceiling.get_color() == "black" and ceiling.get_linewidth() == 2.2
    assert tick_labels(ax) == ["1", "2", "4"]
    assert ax.get_xlabel() == "GPUs (DDP ranks)"
    assert ax.get_ylabel() == "training throughput (images/s, all ranks)"
    assert ax.get_ylim()[0] == 0
    assert ax.get_title() == "DDP training throughput vs GPUs" + TITLE_TAIL


def test_scaling_on_cpu_processes_says_processes():
    r = _result([_run("baseline", 1, 40.0, 0.3), _run("baseline", 2, 70.0, 0.4)], unit="process")
    r.partial = True
    (ax,) = plots.scaling_figure(r).axes
    assert series(ax)["baseline"] == ([1.0, 2.0], [40.0, 70.0])
    assert legend_labels(ax) == ["baseline", "ideal: N × rate at the fewest processes"]
    assert ax.get_xlabel() == "processes (DDP ranks)"
    assert ax.get_title() == "DDP training throughput vs processes (partial)" + TITLE_TAIL


# --- breakdown --------------------------------------------------------------------------------


def test_breakdown_bars_stack_each_runs_parts_in_ms():
    r = _result(_runs())
    (ax,) = plots.breakdown_figure(r).axes
    # runs with steps, in loader order then GPUs; the first at the top
    shown = [x for x in r.runs if x.breakdown is not None]
    order = ["synthetic", "baseline", "torch", "dali"]
    shown.sort(key=lambda x: (order.index(x.loader), x.gpus))
    bars = ax.containers
    assert [b.get_label() for b in bars] == [PART_LABELS[p] for p in PARTS]
    left = [0.0] * len(shown)
    for part, bar in zip(PARTS, bars, strict=True):
        want = [max(0.0, getattr(x.breakdown, part)) * 1e3 for x in shown]
        assert [p.get_width() for p in bar] == pytest.approx(want)
        assert [p.get_x() for p in bar] == pytest.approx(left)
        assert [p.get_y() + p.get_height() / 2 for p in bar] == list(range(len(shown)))[::-1]
        left = [a + b for a, b in zip(left, want, strict=True)]
    assert bars[PARTS.index("other_s")][-2].get_width() == 0  # torch at 4: negative shown as 0
    labels = dict(zip(ax.get_yticks(), tick_labels(ax, "y"), strict=True))
    assert [labels[len(shown) - 1 - i] for i in range(len(shown))] == [
        "synthetic, 1 GPU", "synthetic, 2 GPUs", "synthetic, 4 GPUs", "baseline, 1 GPU",
        "baseline, 2 GPUs", "torch, 2 GPUs", "torch, 4 GPUs", "dali, 4 GPUs *",
    ]  # fmt: skip
    assert texts(ax)[3] == f"{left[3]:.1f} ms, wait 49%"
    assert texts(ax)[-1] == f"{left[-1]:.1f} ms, wait 20%"
    assert len(texts(ax)) == len(shown)
    assert ax.get_xlim() == pytest.approx((0, max(left) * 1.3))
    assert legend_labels(ax) == [PART_LABELS[p] for p in PARTS]
    assert ax.get_xlabel() == "mean time per step (ms)"
    assert ax.get_title() == "Where each training step goes" + TITLE_TAIL


# --- nothing to draw, and writing -------------------------------------------------------------


def test_without_finished_runs_or_steps_nothing_is_drawn(tmp_path):
    failed = _run("baseline", 1, 0.0, None, status="failed", breakdown=None)
    r = _result([failed])
    assert plots.scaling_figure(r) is None and plots.breakdown_figure(r) is None
    assert plots.write_plots(r, tmp_path, "v") == []
    assert list(tmp_path.iterdir()) == []
    no_steps = _result([_run("baseline", 1, 50.0, 0.1, breakdown=None)])
    assert plots.scaling_figure(no_steps) is not None
    assert plots.breakdown_figure(no_steps) is None


def test_write_plots_writes_both_figures_as_png(tmp_path):
    written = plots.write_plots(_result(_runs()), tmp_path / "out", "verify")
    assert written == [
        tmp_path / "out" / "verify-scaling.png",
        tmp_path / "out" / "verify-breakdown.png",
    ]
    for p in written:
        assert_png(p)
