"""A scan's figures, read back from the built Figure: series against the result's numbers, axes,
legends and titles; and each writer's file is a PNG."""

import math

import pytest
from matplotlib.ticker import PercentFormatter

from feedbench.core import envelope
from feedbench.core.envelope import DatasetInfo, HostInfo
from feedbench.core.timeline import MonitorSample, Timeline
from feedbench.report import scan_plots as plots
from feedbench.scan import results as scan_results
from feedbench.scan.results import (
    CacheState,
    CurvePoint,
    Measurement,
    ScanResult,
    StageStats,
    Verdict,
)
from feedbench.scan.sweep import curve_points
from tests.report.figures import (
    assert_png,
    error_bars,
    legend_labels,
    minor_tick_labels,
    series,
    texts,
    tick_labels,
)

COUNTS = (1, 2, 4)
PASSES = ("cold", "warm")
REPEATS = 2


def _stage(name: str, rate: float, samples: int) -> StageStats:
    busy = samples / rate
    return StageStats(name, samples, busy, samples * 110_000, rate, 110_000 * rate / 1e6, 0.25)


def _timeline(label: str, n: int, gpus: int) -> Timeline:
    samples = [
        MonitorSample(
            t_s=0.25 * (i + 1),
            cpu_percent=[min(100.0, 30.0 * n + 5 * (i % 3)), 10.0 * n],
            mem_used_bytes=2_000_000_000,
            disk_read_bytes_per_s=(120 + 10 * math.sin(i)) * 1e6,
            disk_read_iops=900.0,
            net_recv_bytes_per_s=1e4 * i,
            gpu_util_percent=[50.0 + 10 * g + 5 * n for g in range(gpus)],
            gpu_mem_used_bytes=[3 * 2**30] * gpus,
        )
        for i in range(12)
    ]
    return Timeline(label, 0.25, samples, gpu="nvml" if gpus else None)


def _measurement(n: int, pass_name: str, repeat: int, au: bool, timeline: bool, gpus: int):
    jitter = 1 + 0.02 * repeat
    rate = (900.0 if pass_name == "cold" else 2500.0) * n**0.85 * jitter
    samples = 600 * n
    wall = samples / rate
    au_mean = min(1.0, (1.6 if pass_name == "cold" else 2.4) / n**0.8) if au else None
    label = f"{n} consumers, {pass_name}, repeat {repeat}"
    return Measurement(
        consumers=n,
        workers=2,
        pass_name=pass_name,
        repeat=repeat,
        samples=samples,
        files=samples,
        read_bytes=samples * 110_000,
        errors=0,
        batches=samples // 32,
        wall_s=wall,
        first_batch_s=0.05,
        samples_per_s=rate,
        steady_samples_per_s=rate * 1.03,
        mb_per_s=samples * 110_000 / wall / 1e6,
        files_per_s=rate,
        stages=[  # each repeat a little faster, so a mean over repeats is not any one repeat
            _stage("read", (5000.0 / n**0.3 if pass_name == "cold" else 40000.0) * jitter, samples),
            _stage("decode", 700.0 * jitter, samples),
            _stage("augment", 1500.0 * jitter, samples),
            _stage("collate", 9000.0 * jitter, samples),
            StageStats("transfer", 0, 0.0, 0, 0.0, 0.0, 0.0, None, False, "no CUDA device"),
        ],
        cache=CacheState(pass_name, 0.0 if pass_name == "cold" else 1.0),
        au_mean=au_mean,
        au_min=au_mean * 0.93 if au else None,
        monitor=_timeline(label, n, gpus) if timeline else None,
    )


def _curve(measurements: list[Measurement]) -> list[CurvePoint]:
    # the same arithmetic the sweep does, spelled out by hand for the test data
    points = []
    for pass_name in PASSES:
        base = None
        for n in COUNTS:
            ms = [m for m in measurements if m.consumers == n and m.pass_name == pass_name]
            if not ms:
                continue
            rates = [m.samples_per_s for m in ms]
            mean = sum(rates) / len(rates)
            std = (sum((r - mean) ** 2 for r in rates) / max(1, len(rates) - 1)) ** 0.5
            base = mean if n == 1 else base
            aus = [m.au_mean for m in ms if m.au_mean is not None]
            points.append(
                CurvePoint(
                    consumers=n,
                    pass_name=pass_name,
                    repeats=len(ms),
                    samples_per_s_mean=mean,
                    samples_per_s_std=std,
                    samples_per_s_min=min(rates),
                    samples_per_s_max=max(rates),
                    cv=std / mean,
                    mb_per_s_mean=mean * 0.11,
                    efficiency=mean / (n * base) if base else None,
                    au_mean=sum(aus) / len(aus) if aus else None,
                    au_min=min(m.au_min for m in ms) if aus else None,
                )
            )
    return points


def make_result(au: bool = True, timeline: bool = True, gpus: int = 0, curve: bool = True):
    measurements = [
        _measurement(n, p, r, au, timeline, gpus)
        for n in COUNTS
        for p in PASSES
        for r in range(1, REPEATS + 1)
    ]
    return ScanResult(
        kind="scan",
        created_utc="2025-01-01T00:00:00+00:00",
        command=["feedbench", "scan", "/data/imagenet/train"],
        config={"consumers": list(COUNTS)},
        host=HostInfo("bench-host", "Linux-6.8", "3.11.7", 2, 16 * 2**30, "2.5.0", []),
        dataset=DatasetInfo("/data/imagenet/train", "tree", 1200, 1200 * 110_000, 1200),
        measurements=measurements,
        curve=_curve(measurements) if curve else [],
        accelerator={"profile": "resnet50-h200", "step_s": 0.054, "rate": 1200.0} if au else None,
        verdict=Verdict("decode", "cpu", "decode-bound", supported_consumers=2) if au else None,
    )


TITLE_TAIL = "\n/data/imagenet/train on bench-host"
STAGES = ("read", "decode", "augment", "collate")  # transfer is unavailable in the test data


def _pass_curve(result: ScanResult, pass_name: str) -> list[CurvePoint]:
    return sorted((p for p in result.curve if p.pass_name == pass_name), key=lambda p: p.consumers)


def _stage_mean(result: ScanResult, stage: str, pass_name: str, n: int) -> float:
    rates = [
        s.samples_per_s
        for m in result.measurements
        if m.consumers == n and m.pass_name == pass_name
        for s in m.stages
        if s.name == stage
    ]
    assert len(rates) == REPEATS
    return sum(rates) / len(rates)


# --- scaling ----------------------------------------------------------------------------------


def test_scaling_lines_are_the_curve_with_its_ideal_and_the_accelerator_demand():
    r = make_result()
    r.accelerator["name"] = "resnet50 on H200"
    fig = plots.scaling_figure(r)
    ax = fig.axes[0]
    got = series(ax)
    demand = "demand of N accelerators (resnet50 on H200): N × 1,200/s"
    labels = []
    for name in PASSES:
        pts = _pass_curve(r, name)
        line = f"{name} (mean ± σ of {REPEATS} repeats)"
        xs, ys = got[line]
        assert xs == list(COUNTS)
        assert ys == pytest.approx([p.samples_per_s_mean for p in pts])
        xs, lows, highs = error_bars(ax, line)
        assert xs == list(COUNTS)
        assert lows == pytest.approx([p.samples_per_s_mean - p.samples_per_s_std for p in pts])
        assert highs == pytest.approx([p.samples_per_s_mean + p.samples_per_s_std for p in pts])
        ideal = f"ideal {name}: N × 1-consumer rate"
        xs, ys = got[ideal]
        assert xs == list(COUNTS)
        assert ys == pytest.approx([n * pts[0].samples_per_s_mean for n in COUNTS])
        labels += [line, ideal]
    xs, ys = got[demand]
    assert xs == list(COUNTS) and ys == pytest.approx([n * 1200.0 for n in COUNTS])
    assert sorted(got) == sorted([*labels, demand])
    assert sorted(legend_labels(ax)) == sorted(got)
    assert ax.get_legend().get_title().get_text() == (
        "%: efficiency = rate(N) / (N × rate(1)), same workers per consumer"
    )
    # the efficiency at every point beyond one consumer, pass by pass
    assert texts(ax) == [
        f"{p.efficiency:.0%}" for name in PASSES for p in _pass_curve(r, name) if p.consumers != 1
    ]
    assert ax.get_ylabel() == "throughput (samples/s, all consumers)"
    assert ax.get_title() == "Throughput vs consumers" + TITLE_TAIL
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0


def test_scaling_stage_panel_shows_each_stages_own_rate_per_pass():
    r = make_result()
    fig = plots.scaling_figure(r)
    assert len(fig.axes) == 2
    top, ax = fig.axes
    got = series(ax)
    assert sorted(got) == sorted(f"{s}, {p}" for s in STAGES for p in PASSES)
    for stage in STAGES:
        for p in PASSES:
            xs, ys = got[f"{stage}, {p}"]
            assert xs == list(COUNTS)
            assert ys == pytest.approx([_stage_mean(r, stage, p, n) for n in COUNTS])
    assert legend_labels(ax) == [*STAGES, *PASSES]  # colours per stage, then styles per pass
    key = {h.get_label(): h for h in ax.get_legend().legend_handles}
    assert len({key[stage].get_color() for stage in STAGES}) == len(STAGES)
    assert key["cold"].get_linestyle() != key["warm"].get_linestyle()
    for line in ax.get_lines():
        stage, pass_name = line.get_label().split(", ")
        assert line.get_color() == key[stage].get_color()
        assert line.get_linestyle() == key[pass_name].get_linestyle()
    assert ax.get_ylabel() == "samples per busy second\n(one worker, per stage)"
    assert ax.get_title() == "Each stage's own rate (samples / time spent in it)"
    assert ax.get_yscale() == "log"  # decode ≈ 700/s, warm read 40,000/s: decades apart
    assert ax.get_xlabel() == "consumers (emulated GPUs)" and top.get_xlabel() == ""
    assert tick_labels(ax) == ["1", "2", "4"]


def test_scaling_without_an_accelerator_or_stages_is_one_panel_without_demand():
    r = make_result(au=False, timeline=False, curve=False)
    r.measurements = [m for m in r.measurements if m.consumers == 1 and m.pass_name == "cold"][:1]
    r.measurements[0].stages = []
    r.partial = True
    fig = plots.scaling_figure(r)
    (ax,) = fig.axes
    rate = r.measurements[0].steady_samples_per_s
    assert series(ax) == {"cold": ([1.0], pytest.approx([rate]))}  # one point: no ideal line
    assert sorted(legend_labels(ax)) == ["cold"]
    assert ax.get_legend().get_title().get_text() == ""  # no efficiency at one consumer
    assert texts(ax) == []
    assert ax.get_xlabel() == "consumers (emulated GPUs)" and tick_labels(ax) == ["1"]
    assert ax.get_title() == "Throughput vs consumers (partial)" + TITLE_TAIL


def test_scaling_over_a_wide_consumer_range_is_log_log():
    r = make_result(timeline=False, curve=False)
    wide = {1: 1, 2: 4, 4: 16}
    for m in r.measurements:
        m.consumers = wide[m.consumers]
    ax, ax_stage = plots.scaling_figure(r).axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax_stage.get_xscale() == "log" and tick_labels(ax_stage) == ["1", "4", "16"]
    # mathtext is off while the figure draws: the log axis's labels are plain numbers, not the
    # default's "$\\mathdefault{10^{3}}$" shown as its source text
    ax.figure.canvas.draw()
    drawn = [t for t in tick_labels(ax, "y") + minor_tick_labels(ax) if t]
    assert "1,000" in drawn and "10,000" in drawn, drawn
    assert not any("$" in t or "mathdefault" in t for t in drawn), drawn
    assert series(ax)["demand of N accelerators: N × 1,200/s"] == (
        [1.0, 4.0, 16.0],
        pytest.approx([1200.0, 4800.0, 19200.0]),
    )


# --- accelerator utilisation --------------------------------------------------------------------


def test_au_lines_are_the_curves_au_with_the_target_and_the_supported_count():
    r = make_result()
    r.accelerator["name"] = "resnet50 on H200"
    fig = plots.au_figure(r, target=0.8)
    (ax,) = fig.axes
    got = series(ax)
    for name in PASSES:
        pts = _pass_curve(r, name)
        assert got[f"{name}: AU mean"] == (list(map(float, COUNTS)), [p.au_mean for p in pts])
        worst = got[f"{name}: AU of the worst consumer"]
        assert worst == (list(map(float, COUNTS)), [p.au_min for p in pts])
    assert got["target 80%"][1] == [0.8, 0.8]
    assert len(got) == 5
    assert legend_labels(ax) == [
        "cold: AU mean", "cold: AU of the worst consumer", "warm: AU mean",
        "warm: AU of the worst consumer", "target 80%",
    ]  # fmt: skip
    (supported,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("_")]
    assert list(supported.get_xdata()) == [2, 2]  # the verdict's supported consumers
    assert texts(ax) == ["supported: 2"]
    assert ax.get_ylim() == (0, 1.05)
    assert isinstance(ax.yaxis.get_major_formatter(), PercentFormatter)
    assert ax.get_ylabel() == "accelerator utilisation (step / (step + wait))"
    assert ax.get_xlabel() == "consumers (emulated GPUs)"
    assert ax.get_title() == "Accelerator utilisation vs consumers — resnet50 on H200" + TITLE_TAIL


def test_without_au_there_is_no_au_figure(tmp_path):
    r = make_result(au=False)
    assert plots.au_figure(r) is None
    target = tmp_path / "x-au.png"
    assert plots.au_plot(r, target) is None
    assert not target.exists()
    written = plots.write_all(r, tmp_path, "x")
    assert [p.name for p in written] == ["x-scaling.png", "x-timeline.png"]


# --- timeline ---------------------------------------------------------------------------------


def _segments(result: ScanResult):
    """(measurement, its offset on the shared time axis)."""
    offset = 0.0
    for m in result.measurements:
        yield m, offset
        offset += m.monitor.samples[-1].t_s


def _steps(offset: float, m: Measurement, values: list[float]) -> tuple[list[float], list[float]]:
    xs = [offset] + [offset + s.t_s for s in m.monitor.samples]
    return pytest.approx(xs), pytest.approx([values[0], *values])


def test_timeline_panels_are_each_measurements_readings_one_after_another():
    r = make_result(gpus=2)
    fig = plots.timeline_figure(r)
    strip, cpu, disk, net, gpu = fig.axes
    for m, offset in _segments(r):
        label = m.monitor.label
        samples = m.monitor.samples
        cpu_cores = [sum(s.cpu_percent) / 100 for s in samples]
        assert series(cpu)[label] == _steps(offset, m, cpu_cores)
        disk_mb = [s.disk_read_bytes_per_s / 1e6 for s in samples]
        assert series(disk)[label] == _steps(offset, m, disk_mb)
        net_mb = [s.net_recv_bytes_per_s / 1e6 for s in samples]
        assert series(net)[label] == _steps(offset, m, net_mb)
        gpu_mean = [sum(s.gpu_util_percent) / 2 for s in samples]
        assert series(gpu)[label] == _steps(offset, m, gpu_mean)
    end = offset + m.monitor.samples[-1].t_s
    assert len(gpu.collections) == len(r.measurements)  # a min–max band per measurement
    assert texts(strip) == [m.monitor.label for m in r.measurements]
    cores = [ln for ln in cpu.get_lines() if list(ln.get_ydata()) == [2, 2]]
    assert len(cores) == 1 and cores[0].get_linestyle() == ":"  # the host's 2 cores
    assert legend_labels(cpu) == ["cold", "warm", "2 cores"]
    assert [a.get_ylabel() for a in (cpu, disk, net, gpu)] == [
        "CPU busy\n(cores)", "disk read\n(MB/s)", "network in\n(MB/s)",
        "GPU util (%)\nmean, band min–max",
    ]  # fmt: skip
    assert gpu.get_xlabel() == "time within each measurement, measurements one after another (s)"
    assert all(a.get_xlim() == pytest.approx((0, end)) for a in (cpu, disk, net, gpu))
    assert fig.get_suptitle() == "Resources during the measurements" + TITLE_TAIL


def test_timeline_without_gpu_readings_has_three_panels():
    r = make_result(gpus=0)
    strip, cpu, disk, net = plots.timeline_figure(r).axes
    assert net.get_xlabel().startswith("time within each measurement")
    m = r.measurements[0]
    assert series(cpu)[m.monitor.label] == _steps(0.0, m, [sum(s.cpu_percent) / 100
                                                           for s in m.monitor.samples])  # fmt: skip


def test_gpu_readings_that_stop_part_way_are_points_only():
    r = make_result(gpus=2)
    first = r.measurements[0]
    for s in first.monitor.samples[6:]:
        s.gpu_util_percent = []
    gpu = plots.timeline_figure(r).axes[4]
    xs, ys = series(gpu)[first.monitor.label]
    kept = first.monitor.samples[:6]
    assert xs == pytest.approx([s.t_s for s in kept])
    assert ys == pytest.approx([sum(s.gpu_util_percent) / 2 for s in kept])
    (points,) = [ln for ln in gpu.get_lines() if ln.get_label() == first.monitor.label]
    assert points.get_linestyle() == "None" and points.get_marker() == "."


def test_without_timelines_there_is_no_timeline_figure(tmp_path):
    r = make_result(timeline=False)
    assert plots.timeline_figure(r) is None
    assert plots.timeline_plot(r, tmp_path / "t.png") is None
    assert not (tmp_path / "t.png").exists()
    assert [p.name for p in plots.write_all(r, tmp_path, "y")] == ["y-scaling.png", "y-au.png"]


# --- writing ----------------------------------------------------------------------------------


def test_write_all_writes_every_figure_as_png(tmp_path):
    written = plots.write_all(make_result(gpus=2), tmp_path / "out", "scan")
    assert [p.name for p in written] == ["scan-scaling.png", "scan-au.png", "scan-timeline.png"]
    for p in written:
        assert_png(p)


def test_each_writer_returns_the_png_it_wrote(tmp_path):
    r = make_result()
    for fn, name in [
        (plots.scaling_plot, "s.png"),
        (plots.au_plot, "a.png"),
        (plots.timeline_plot, "t.png"),
    ]:
        out = fn(r, tmp_path / "sub" / name)
        assert out == tmp_path / "sub" / name
        assert_png(out)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["a.png", "s.png", "t.png"]


def test_a_result_loaded_from_json_draws_the_same_series(tmp_path):
    path = tmp_path / "result.json"
    original = make_result(gpus=1)
    envelope.save(original, path)
    loaded = scan_results.load(path)
    assert loaded.measurements[0].monitor.samples[0].gpu_util_percent
    for build in (plots.scaling_figure, plots.au_figure, plots.timeline_figure):
        for a, b in zip(build(original).axes, build(loaded).axes, strict=True):
            assert series(a) == series(b)
            assert texts(a) == texts(b)


def test_curve_from_measurements_when_the_result_has_none():
    with_curve, without = make_result(), make_result(curve=False)
    for m in without.measurements:  # the hand-built curve uses whole-pass rates
        m.steady_samples_per_s = None
    derived = curve_points(without)
    assert sorted((p.consumers, p.pass_name) for p in derived) == sorted(
        (p.consumers, p.pass_name) for p in with_curve.curve
    )
    given = {(p.consumers, p.pass_name): p for p in with_curve.curve}
    for p in derived:
        q = given[(p.consumers, p.pass_name)]
        assert p.samples_per_s_mean == pytest.approx(q.samples_per_s_mean)
        assert p.samples_per_s_std == pytest.approx(q.samples_per_s_std)
        assert p.efficiency == pytest.approx(q.efficiency)
        assert p.au_mean == pytest.approx(q.au_mean) and p.au_min == pytest.approx(q.au_min)
    a, b = plots.scaling_figure(with_curve).axes[0], plots.scaling_figure(without).axes[0]
    assert series(a).keys() == series(b).keys()
    for label, (xs, ys) in series(a).items():
        assert series(b)[label] == (xs, pytest.approx(ys))


def test_an_empty_result_draws_and_writes_nothing(tmp_path):
    r = make_result(curve=False)
    r.measurements = []
    assert plots.scaling_figure(r) is None and plots.timeline_figure(r) is None
    assert plots.write_all(r, tmp_path / "none", "empty") == []
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())


def test_with_the_cores_shared_out_there_is_no_ideal_line_but_speedup_and_failed_points_say_so():
    """Default workers (cores / N): N × rate(1) is no ideal; the points carry the speedup. A
    failed measurement is no point, and the figure says so."""
    from feedbench.scan.sweep import curve
    from tests.report.figures import legend_labels, texts

    r = make_result(au=False, timeline=False, curve=False)
    for m in r.measurements:
        m.workers = 8 // m.consumers  # 8 cores shared out
    failed = r.measurements[-1]
    failed.failed = "stalled: no consumer read a byte or took a batch for 60 s"
    r.curve = curve(r.measurements)
    fig = plots.scaling_figure(r)
    ax = fig.axes[0]
    assert not [t for t in legend_labels(ax) if t.startswith("ideal")]
    speedups = [t for t in texts(ax) if t.startswith("×")]
    assert speedups and all(t[1:].replace(".", "").isdigit() for t in speedups)
    title = ax.get_legend().get_title().get_text()
    assert "speedup = rate(N) / rate(1), the cores shared out" in title
    note = [t for t in texts(ax) if t.startswith("not plotted, failed:")]
    assert note and "stalled" in note[0] and f"{failed.consumers} consumers" in note[0]


def test_dollars_and_control_characters_in_a_path_are_drawn_as_written(tmp_path):
    """Two ``$`` in a path were read as mathtext: the figures failed with a parse error (and
    the scan exited "not all written"); a control character drew as itself."""
    import dataclasses

    r = make_result(gpus=2)
    r = dataclasses.replace(r, dataset=dataclasses.replace(r.dataset, path="/d/$x^$/\x1b[31m"))
    written = plots.write_all(r, tmp_path / "out", "scan")
    assert len(written) == 3
    title = plots.scaling_figure(r).axes[0].get_title()
    assert title.endswith("/d/$x^$/\\x1b[31m on bench-host")
