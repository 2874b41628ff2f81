"""Loader workers and threads off the training process's reserved cores (loaders.affinity)."""

from __future__ import annotations

import os
import threading

import pytest

from loaders.affinity import loader_cores, started_on

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


@pytest.mark.parametrize(
    ("reserve", "local_rank", "local_world", "cpus", "expected"),
    [
        (2, 0, 1, range(16), set(range(2, 16))),  # one rank keeps cores 0-1
        (2, 1, 2, range(16), set(range(4, 16))),  # every rank's reserved cores are left out
        (0, 0, 1, range(16), None),  # nothing reserved: no change
        (2, 0, 1, range(2), None),  # the loader would keep less than half: no change
        (1, 0, 1, [3, 5, 9], {5, 9}),  # the allowed cores, not 0..n
    ],
)
def test_loader_cores(reserve, local_rank, local_world, cpus, expected, monkeypatch):
    # one hardware thread per core, as on the H200 host (lscpu: 1 thread per core)
    monkeypatch.setattr("loaders.affinity._siblings", lambda cpu: {cpu})
    assert loader_cores(reserve, local_rank, local_world, set(cpus)) == expected


def test_smt_siblings_are_reserved_with_their_core(monkeypatch):
    # cores 0-3 with hardware threads (0, 4), (1, 5), ...: reserving a core reserves both
    monkeypatch.setattr("loaders.affinity._siblings", lambda cpu: {cpu % 4, cpu % 4 + 4})
    assert loader_cores(1, 0, 1, set(range(8))) == {1, 2, 3, 5, 6, 7}


def test_threads_started_inside_inherit_and_the_caller_is_restored():
    before = os.sched_getaffinity(0)
    target = {min(before)}
    seen: list[set[int]] = []
    with started_on(target):
        t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        t.start()
    t.join()
    assert seen == [target]
    assert os.sched_getaffinity(0) == before
    with started_on(None):  # no change asked: nothing touched
        assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
@pytest.mark.parametrize("backend", ["torch", "wds"])
def test_workers_run_off_the_reserved_cores(dataset, backend):
    """A real loader: its worker processes run on the cores left after the reserve, while the
    training process keeps every core."""
    import psutil

    import loaders

    allowed = os.sched_getaffinity(0)
    expected = loader_cores(1, 0, 1)
    assert expected and expected < allowed
    source = dataset / ("shards" if backend == "wds" else "images")
    loader = loaders.build_loader(
        source, backend=backend, batch_size=4, workers=1, device="cpu", image_size=32,
        reserve_cores=1,
    )  # fmt: skip
    try:
        next(iter(loader))
        workers = loader.dataloader._iterator._workers
        assert [set(psutil.Process(w.pid).cpu_affinity()) for w in workers] == [expected]
        assert os.sched_getaffinity(0) == allowed
    finally:
        loader.close()


def test_a_dataloader_started_on_fewer_cores_than_its_workers_does_not_warn():
    import warnings

    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(4)), batch_size=2, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DataLoader's "will create 2 worker processes" would raise
        with started_on({sorted(os.sched_getaffinity(0))[0]}):  # one core for two workers
            batches = list(iter(loader))
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3]]
