"""DevicePrefetcher's staged mode (issue 29): the host batches taken and prepared on a thread of
their own. On the CPU the thread normalises (no copy), so its hand-over, order, errors and
closing are tested here; the CUDA path (events, streams) is in test_loaders_gpu."""

from __future__ import annotations

import threading

import pytest
import torch

from loaders.prefetch import DevicePrefetcher


def _batches(n: int, closed: list, fail_at: int | None = None):
    try:
        for i in range(n):
            if i == fail_at:
                raise OSError(f"cannot read batch {i}")
            images = torch.full((2, 4, 4, 3), i, dtype=torch.uint8)
            yield images, torch.tensor([i, i]), torch.tensor([2 * i, 2 * i + 1])
    finally:
        closed.append(threading.current_thread().name)


def _stagers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "feedbench-stager"]


def _prefetcher(source) -> DevicePrefetcher:
    return DevicePrefetcher(source, torch.device("cpu"), lambda x: x.float() / 2, staged=True)


def test_staged_batches_arrive_in_order_prepared_and_the_thread_ends():
    closed: list = []
    got = list(_prefetcher(_batches(7, closed)))
    assert [int(labels[0]) for _, labels, _ in got] == list(range(7))
    assert all(float(images.max()) == i / 2 for i, (images, _, _) in enumerate(got))
    assert closed == ["feedbench-stager"]  # the host iterator ran (and ended) on the stager
    assert not _stagers()


def test_a_consumer_that_stops_early_closes_the_host_iterator_on_the_stager():
    closed: list = []
    it = iter(_prefetcher(_batches(100, closed)))
    first = [next(it) for _ in range(3)]
    it.close()
    assert [int(b[1][0]) for b in first] == [0, 1, 2]
    assert closed == ["feedbench-stager"]
    assert not _stagers()


def test_an_error_of_the_host_iterator_reaches_the_consumer_after_the_batches_before_it():
    closed: list = []
    seen = []
    with pytest.raises(OSError, match="cannot read batch 4"):
        for _, labels, _ in _prefetcher(_batches(10, closed, fail_at=4)):
            seen.append(int(labels[0]))
    assert seen == [0, 1, 2, 3]
    assert not _stagers()
