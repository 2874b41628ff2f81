"""The scaling curve: repeats summarised, failed measurements counted apart, and efficiency only
against a baseline with the same resources per consumer."""

from __future__ import annotations

import pytest

from feedbench.scan.results import CacheState, Measurement
from feedbench.scan.sweep import curve


def _m(n, rate, *, workers=1, repeat=1, failed=None):
    return Measurement(
        consumers=n, workers=workers, pass_name="cold", repeat=repeat, samples=100, files=100,
        read_bytes=1000, errors=0, batches=10, wall_s=1.0, first_batch_s=0.1, samples_per_s=rate,
        steady_samples_per_s=rate, mb_per_s=1.0, files_per_s=100.0, stages=[],
        cache=CacheState("cold", 0.0), failed=failed,
    )  # fmt: skip


def test_with_the_cores_shared_out_there_is_speedup_but_no_efficiency():
    # 16 cores: 16 workers for one consumer, 8 each for two, 4 each for four
    one, two, four = curve([_m(1, 1000, workers=16), _m(2, 1200, workers=8), _m(4, 900, workers=4)])
    assert one.speedup == pytest.approx(1.0) and one.efficiency == pytest.approx(1.0)
    assert two.speedup == pytest.approx(1.2) and two.efficiency is None
    assert four.speedup == pytest.approx(0.9) and four.efficiency is None
    assert [p.workers for p in (one, two, four)] == [16, 8, 4]


def test_with_fixed_workers_efficiency_is_against_n_times_one():
    one, two = curve([_m(1, 100, workers=2), _m(2, 150, workers=2)])
    assert two.efficiency == pytest.approx(0.75) and two.speedup == pytest.approx(1.5)


def test_failed_repeats_are_left_out_of_the_mean_and_counted():
    pts = curve([
        _m(1, 100, repeat=1), _m(1, 110, repeat=2), _m(1, 0.0, repeat=3, failed="stalled"),
        _m(2, 0.0, failed="48 of 48 samples failed"),
    ])  # fmt: skip
    assert len(pts) == 1  # nothing measured at 2 consumers: no point, not a 0 samples/s point
    (one,) = pts
    assert one.repeats == 2 and one.failed == 1 and one.samples_per_s_mean == pytest.approx(105)
