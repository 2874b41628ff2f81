"""The sizing rules and the accelerators a scan feeds, on results built to break each rule."""

from __future__ import annotations

import dataclasses

import pytest

from feedbench.core.envelope import DatasetInfo, envelope
from feedbench.scan.results import CacheState, Measurement, ScanResult
from feedbench.scan.sizing import MAX_CV, assess, fed
from feedbench.scan.sweep import curve

GB = 10**9


def _measurement(n: int, rate: float, au: float | None, pass_name="cold", resident=0.0):
    return Measurement(
        consumers=n, workers=1, pass_name=pass_name, repeat=0, samples=100 * n, files=100 * n,
        read_bytes=10**6 * n, errors=0, batches=10, wall_s=1.0, first_batch_s=0.1,
        samples_per_s=rate, steady_samples_per_s=rate, files_per_s=rate,
        mb_per_s=rate / 100, stages=[], cache=CacheState(pass_name, resident), per_consumer=[],
        au_mean=au, au_min=au,
    )  # fmt: skip


def _result(measurements, dataset_bytes=200 * GB, accelerator=True) -> ScanResult:
    r = ScanResult(
        **envelope("scan", {"path": "/d"}, "/d"),
        dataset=DatasetInfo(path="/d", format="tree", files=10, bytes=dataset_bytes, samples=10),
        measurements=measurements,
        accelerator={"name": "h200", "samples_per_s": 100.0} if accelerator else None,
    )
    r.host = dataclasses.replace(r.host, memory_bytes=32 * GB, cpu_count=2)
    r.curve = curve(measurements)
    return r


def _repeats(n, rates, au, **kw):
    return [dataclasses.replace(_measurement(n, x, au, **kw), repeat=i) for i, x in
            enumerate(rates)]  # fmt: skip


def test_fed_is_the_accelerator_time_given_capped_at_the_consumers():
    assert fed(8, 0.6, 0.9) == pytest.approx(8 * 0.6 / 0.9)  # 5.3 kept at 0.9
    assert fed(4, 0.95, 0.9) == 4.0  # above the target: no more than the consumers


def test_a_run_by_the_rules_is_valid_and_feeds_a_fraction():
    ms = _repeats(1, [100, 101, 99], 0.97) + _repeats(4, [300, 303, 297], 0.72)
    z = assess(_result(ms), 0.9)
    assert z.valid and z.broken == [] and z.label() == "valid for sizing"
    assert z.at_consumers == 4 and z.accelerators_fed == pytest.approx(4 * 0.72 / 0.9)
    assert z.accelerators_fed_std == pytest.approx(0.0)  # the same AU in every repeat


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"dataset_bytes": 100 * GB}, "under 5× this client's RAM (32 GB)"),
        ({"rates": [100, 101]}, "2 repeats per point (needs ≥ 3)"),
        ({"rates": [100, 150, 60]}, f"(needs ≤ {MAX_CV:.0%})"),
        ({"pass_name": "warm"}, "no cold first pass"),
        ({"resident": 0.4}, "the page cache was not emptied"),
        ({"partial": True}, "the scan did not complete"),
    ],
)
def test_each_broken_rule_makes_the_run_not_valid(change, rule):
    kw = {k: change[k] for k in ("pass_name", "resident") if k in change}
    result = _result(_repeats(2, change.get("rates", [100, 100, 100]), 0.9, **kw),
                     dataset_bytes=change.get("dataset_bytes", 200 * GB))  # fmt: skip
    result.partial = change.get("partial", False)
    z = assess(result, 0.9)
    assert not z.valid and len(z.broken) == 1 and rule in z.broken[0], z.broken
    assert z.label().startswith("not valid for sizing: ")


def test_without_an_emulated_step_nothing_is_fed():
    z = assess(_result(_repeats(1, [100, 100, 100], None), accelerator=False), 0.9)
    assert z.accelerators_fed is None and z.target_au is None and z.valid


def test_other_processes_busy_during_a_measurement_make_it_not_valid():
    from feedbench.core.timeline import MonitorSample, Timeline

    def sample(t, own):
        return MonitorSample(t_s=t, cpu_percent=[100.0, 100.0], mem_used_bytes=0,
                             disk_read_bytes_per_s=0.0, disk_read_iops=0.0,
                             net_recv_bytes_per_s=0.0, own_busy_cores=own,
                             other_busy_cores=2.0 - own)  # fmt: skip

    ms = _repeats(1, [100, 100, 100], 0.95)
    ms[1].monitor = Timeline(label="", interval_s=0.5, samples=[sample(0.5, 0.3), sample(1, 0.5)])
    z = assess(_result(ms), 0.9)
    assert not z.valid and z.broken == [
        "other processes kept 1.6 of 2 cores busy during 1 consumer, cold pass: the host was not "
        "idle"
    ]
    ms[1].monitor.samples = [sample(0.5, 1.9), sample(1, 2.0)]  # the scan's own: no rule broken
    assert assess(_result(ms), 0.9).valid
