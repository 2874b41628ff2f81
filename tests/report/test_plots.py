import math

import pytest
from PIL import Image

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
    rate = (900.0 if pass_name == "cold" else 2500.0) * n**0.85 * (1 + 0.02 * repeat)
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
        stages=[
            _stage("read", 5000.0 / n**0.3 if pass_name == "cold" else 40000.0, samples),
            _stage("decode", 700.0, samples),
            _stage("augment", 1500.0, samples),
            _stage("collate", 9000.0, samples),
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


def _assert_png(path) -> None:
    assert path.is_file() and path.stat().st_size > 0
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.size[0] > 300 and img.size[1] > 300
        img.verify()


def test_write_all_with_everything(tmp_path):
    written = plots.write_all(make_result(gpus=2), tmp_path / "out", "scan")
    assert [p.name for p in written] == ["scan-scaling.png", "scan-au.png", "scan-timeline.png"]
    for p in written:
        _assert_png(p)


def test_without_au_there_is_no_au_plot(tmp_path):
    r = make_result(au=False)
    target = tmp_path / "x-au.png"
    assert plots.au_plot(r, target) is None
    assert not target.exists()
    written = plots.write_all(r, tmp_path, "x")
    assert [p.name for p in written] == ["x-scaling.png", "x-timeline.png"]
    for p in written:
        _assert_png(p)


def test_without_timelines_there_is_no_timeline_plot(tmp_path):
    r = make_result(timeline=False)
    assert plots.timeline_plot(r, tmp_path / "t.png") is None
    assert not (tmp_path / "t.png").exists()
    assert [p.name for p in plots.write_all(r, tmp_path, "y")] == ["y-scaling.png", "y-au.png"]


def test_each_function_returns_the_path_it_wrote(tmp_path):
    r = make_result()
    for fn, name in [
        (plots.scaling_plot, "s.png"),
        (plots.au_plot, "a.png"),
        (plots.timeline_plot, "t.png"),
    ]:
        out = fn(r, tmp_path / "sub" / name)
        assert out == tmp_path / "sub" / name
        _assert_png(out)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["a.png", "s.png", "t.png"]


def test_a_result_loaded_from_json_plots(tmp_path):
    path = tmp_path / "result.json"
    envelope.save(make_result(gpus=1), path)
    loaded = scan_results.load(path)
    assert loaded.measurements[0].monitor.samples[0].gpu_util_percent
    written = plots.write_all(loaded, tmp_path, "loaded")
    assert len(written) == 3
    for p in written:
        _assert_png(p)


def test_curve_from_measurements_when_the_result_has_none(tmp_path):
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
    assert len(plots.write_all(without, tmp_path, "derived")) == 3


def test_one_consumer_one_pass_without_stage_stats(tmp_path):
    r = make_result(au=False, timeline=False, curve=False)
    r.measurements = [m for m in r.measurements if m.consumers == 1 and m.pass_name == "cold"][:1]
    r.measurements[0].stages = []
    r.partial = True
    _assert_png(plots.scaling_plot(r, tmp_path / "one.png"))


def test_an_empty_result_writes_nothing(tmp_path):
    r = make_result(curve=False)
    r.measurements = []
    assert plots.write_all(r, tmp_path / "none", "empty") == []
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())
