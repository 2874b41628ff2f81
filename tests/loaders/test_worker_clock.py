"""Each loader worker's time making batches, in shared memory the training process reads
(loaders.worker_clock): real DataLoader workers of the torch and wds backends."""

from __future__ import annotations

import threading
import time

import pytest

from loaders import build_loader
from loaders.slots import BatchSlots
from loaders.worker_clock import COLUMNS, WorkerClock


@pytest.mark.parametrize("backend,folder", [("torch", "images"), ("wds", "shards")])
def test_every_worker_adds_its_batches_and_time(dataset, backend, folder):
    loader = build_loader(str(dataset / folder), backend=backend, batch_size=4, workers=2,
                          device="cpu", image_size=64, slots=True, prefetch=2)  # fmt: skip
    try:
        assert loader.clock is not None and loader.clock.snapshot().shape == (2, len(COLUMNS))
        taken = sum(1 for _ in loader)
        table = loader.clock.snapshot()
    finally:
        loader.close()
    batches, make_s, slot_wait_s = table[:, 0], table[:, 1], table[:, 2]
    # every batch taken was made by a worker, and the workers went on into the next epoch by
    # at most what they may hold ahead (prefetch 2 each, one more in hand)
    assert taken <= batches.sum() <= taken + 2 * 3
    assert (batches >= 1).all() and (make_s > 0).all()
    assert (slot_wait_s >= 0).all() and (slot_wait_s <= make_s).all()


def test_no_workers_no_clock(dataset):
    loader = build_loader(str(dataset / "images"), backend="torch", batch_size=4, workers=0,
                          device="cpu", image_size=64)  # fmt: skip
    assert loader.clock is None


def test_outside_a_worker_nothing_is_counted():
    clock = WorkerClock(2)
    assert clock.timed(lambda: 7) == 7
    assert clock.snapshot().sum() == 0
    clock.add(1, 0.5, 0.25)
    clock.add(1, 0.5)
    assert clock.snapshot().tolist() == [[0, 0, 0], [2, 1.0, 0.25]]


def test_a_claim_says_how_long_it_waited_for_its_slot():
    slots = BatchSlots(1, 2, 2, 16)
    slots._flags[0] = 1  # the training process still has the worker's first slot
    # released 300 ms on: the claim waits most of it however late a loaded CI starts it
    threading.Timer(0.3, slots.release, args=(0,)).start()
    t0 = time.monotonic()
    slot, _, _ = slots.claim()
    assert slot == 0 and 0.15 <= slots.last_wait_s <= time.monotonic() - t0
    slot, _, _ = slots.claim()  # the next one is free
    assert slot == 1 and slots.last_wait_s < 0.05
