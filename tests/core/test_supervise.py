"""The stall watchdog's rule, on a clock the test controls."""

from __future__ import annotations

import pytest

from feedbench.core import supervise
from feedbench.core.supervise import Watchdog


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(supervise.time, "monotonic", lambda: now[0])
    return now


def test_a_stall_is_no_counter_moving_for_the_timeout(clock):
    dog = Watchdog(2, timeout_s=5, startup_s=60)
    assert not dog.check([(0, 0), (0, 0)])
    clock[0] += 3
    assert not dog.check([(0, 1), (0, 0)])  # consumer 0 is ready: start-up is over
    clock[0] += 4
    assert not dog.check([(100, 2), (0, 0)])  # it reads: not stalled (consumer 1 waits)
    clock[0] += 5.5
    assert dog.check([(100, 2), (0, 0)])  # nothing moved for 5.5 s
    (first, silent), _ = dog.silent()
    assert first == 1 and silent == pytest.approx(12.5)  # consumer 1 never moved


def test_start_up_gets_its_own_allowance(clock):
    dog = Watchdog(1, timeout_s=5, startup_s=60)
    assert not dog.check([(0, 0)])
    clock[0] += 64
    assert not dog.check([(0, 0)])  # importing, connecting: 65 s allowed before the first move
    clock[0] += 2
    assert dog.check([(0, 0)])


def test_a_busy_process_is_not_silent(clock):
    """Listing or building an index moves no counter: busy, it is no stall however long."""
    dog = Watchdog(2, timeout_s=5, startup_s=0)
    assert not dog.check([(0, 1), (0, 1)])
    clock[0] += 100
    assert not dog.check([(0, 1), (0, 1)], busy=[True, False])  # consumer 0 lists
    clock[0] += 6
    assert dog.check([(0, 1), (0, 1)], busy=[False, False])  # listed, then nothing for 6 s
    (first, silent), _ = dog.silent()
    assert first == 1 and silent == pytest.approx(106)
