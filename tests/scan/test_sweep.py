"""The scaling curve: repeats summarised, failed measurements counted apart, and efficiency only
against a baseline with the same resources per consumer."""

from __future__ import annotations

import pytest

from feedbench.scan.results import CacheState, Measurement
from feedbench.scan.sweep import curve, find_max


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


# --- find-max with counts it cannot decide (windows too short to judge their AU by) -----------


def _probe(max_ok: int, undecided: set[int], seen: list[int]):
    """Passes up to ``max_ok``, fails above it; None (undecided) at ``undecided``."""

    def probe(n: int) -> bool | None:
        seen.append(n)
        return None if n in undecided else n <= max_ok

    return probe


@pytest.mark.parametrize(
    ("max_ok", "undecided", "limit", "best", "probes", "at"),
    [
        (5, {1}, 16, 0, [1], 1),  # nothing decided: no lower bound either
        (5, {8}, 16, 4, [1, 2, 4, 8], 8),  # growing: 4 passed, 8 cannot tell fail from pass
        (5, {6}, 16, 4, [1, 2, 4, 8, 6], 6),  # bisecting: 5 is never probed
        (40, {12}, 12, 8, [1, 2, 4, 8, 12], 12),  # the limit itself
        (5, {3}, 16, 5, [1, 2, 4, 8, 6, 5], None),  # off the search's path: the answer stands
    ],
)
def test_find_max_stops_at_an_undecided_count(max_ok, undecided, limit, best, probes, at):
    seen: list[int] = []
    found = find_max(_probe(max_ok, undecided, seen), limit=limit)
    assert seen == probes and list(found.tried) == probes
    assert found.best == best and found.undecided_at == at
    assert [n for n, ok in found.tried.items() if ok is None] == ([at] if at else [])


def test_find_max_stops_at_a_known_undecided_count_without_probing_it_again():
    seen: list[int] = []
    found = find_max(_probe(8, set(), seen), limit=8, known={1: True, 2: None})
    assert seen == [] and found.best == 1 and found.undecided_at == 2
    # a known failure still bounds the search from above as before
    found = find_max(_probe(8, {3}, seen), limit=8, known={1: True, 2: True, 4: False})
    assert seen == [3] and found.best == 2 and found.undecided_at == 3
