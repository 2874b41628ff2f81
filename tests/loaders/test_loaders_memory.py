"""Host memory does not grow across epochs with workers > 0 (the copy-on-read pitfall), any backend.

Stated bound: after two warm-up epochs, 10 more epochs over 1,001 samples grow the unique set size
(USS: memory private to a process, which is where pages copied on read or write go) of the consumer
process plus its worker processes by less than 32 MiB in total (measured here: about 1-3 MiB for
each backend). Not the proportional set size (PSS): it counts a share of every shared library's
pages, and grows when another process using the same libraries exits (seen: +38 MiB for DALI
while other DALI processes ran and ended beside the test).
"""

from __future__ import annotations

import contextlib

import pytest

from tests.loaders.test_loaders import make_tiny

BOUND_BYTES = 32 * 2**20
EPOCHS = 10


def _uss_bytes() -> int:
    import psutil

    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker that just exited
            total += p.memory_full_info().uss
    return total


def _measure(_: int, root: str, queue) -> None:
    import gc

    import torch

    from loaders import build_loader

    torch.set_num_threads(1)
    out = {}
    for backend, kind in [("torch", "tree"), ("wds", "shards"), ("dali", "tree")]:
        extra = {"multiprocessing_context": "fork"} if backend != "dali" else {}
        loader = build_loader(
            f"{root}/{kind}", backend, 32, image_size=16, workers=2, device="cpu", **extra
        )
        for _ in range(2):  # warm-up: workers started, buffers and caches allocated
            for _ in loader:
                pass
        gc.collect()
        before = _uss_bytes()
        for _ in range(EPOCHS):
            for _ in loader:
                pass
        gc.collect()
        out[backend] = (before, _uss_bytes())
        loader.close()
    queue.put(out)


@pytest.mark.slow
def test_no_host_memory_growth_across_epochs(tmp_path):
    import torch.multiprocessing as mp

    make_tiny(tmp_path)
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_measure, args=(str(tmp_path), q), nprocs=1, join=True, start_method="spawn")
    for backend, (before, after) in q.get().items():
        assert after - before < BOUND_BYTES, (backend, before, after)
