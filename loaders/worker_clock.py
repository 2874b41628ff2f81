"""How long each loader worker takes to make its batches, in memory the training process reads.

A DataLoader takes its workers' batches in a fixed turn, so a loader that falls short shows the
training process one wait per round of turns whether every worker is slow, one of them is, or
they wait for a batch slot (BENCHMARKS.md, "Waits once per round of the workers' turns"). Each
worker adds to its own row of a shared table: batches made, seconds making them (from the
request to the batch handed to DataLoader, reading and decoding included) and, of those, seconds
waiting for a batch slot (:mod:`loaders.slots`). The training process takes snapshots
(:meth:`WorkerClock.snapshot`), e.g. at a measured window's ends, and subtracts them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch
from torch.utils.data import get_worker_info

COLUMNS = ("batches", "make_s", "slot_wait_s")
T = TypeVar("T")


class WorkerClock:
    """A ``workers × len(COLUMNS)`` float64 table in shared memory, a row per worker; each
    worker writes only its own row (picklable: spawned workers map the same memory)."""

    def __init__(self, workers: int) -> None:
        self.table = torch.zeros((max(1, workers), len(COLUMNS)), dtype=torch.float64)
        self.table.share_memory_()

    def timed(self, make: Callable[[], T], slots=None) -> T:
        """``make()``'s result, its time added to the calling worker's row (``slots``: the
        :class:`loaders.slots.BatchSlots` it claimed one of); outside a worker, just ``make()``."""
        info = get_worker_info()
        if info is None:
            return make()
        t0 = time.perf_counter()
        out = make()
        self.since(info.id, t0, slots)
        return out

    def since(self, worker: int, t0: float, slots=None) -> None:
        """A batch made by ``worker`` from ``time.perf_counter()`` = ``t0`` until now, of it
        waiting for its slot of ``slots`` (if any) what that slot's claim waited."""
        wait = slots.last_wait_s if slots is not None else 0.0
        self.add(worker, time.perf_counter() - t0, wait)

    def add(self, worker: int, make_s: float, slot_wait_s: float = 0.0) -> None:
        row = self.table[worker].numpy()
        row += (1.0, make_s, slot_wait_s)

    def snapshot(self) -> np.ndarray:
        """A copy of the table now (rows: workers; columns: :data:`COLUMNS`)."""
        return self.table.numpy().copy()
