import os

import numpy as np
import pytest
import torch.distributed as tdist
import torch.multiprocessing as mp

from loaders.dist import discover, shard_indices

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_default_is_single_process(clean_env):
    d = discover()
    assert (d.rank, d.world_size, d.local_rank, d.source) == (0, 1, 0, "default")
    assert not d.distributed


def test_torchrun_environment_two_nodes(clean_env):
    # node 1 of 2, 4 GPUs each: global rank 6 is local rank 2 — the shard follows the global rank
    for k, v in {
        "RANK": "6",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
    }.items():
        clean_env.setenv(k, v)
    d = discover()
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size) == (6, 8, 2, 4)
    assert d.source == "environment"


def test_arguments_win_field_by_field(clean_env):
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "4")
    clean_env.setenv("LOCAL_RANK", "1")
    d = discover(rank=3)
    assert (d.rank, d.world_size, d.local_rank, d.source) == (3, 4, 1, "arguments")


def test_invalid_values(clean_env):
    with pytest.raises(ValueError, match="outside world size"):
        discover(rank=2, world_size=2)
    with pytest.raises(ValueError, match="at least 1"):
        discover(rank=0, world_size=0)
    clean_env.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x' is not an integer"):
        discover()


def _worker(rank: int, world: int, store: str, out) -> None:
    for name in _ENV:
        os.environ.pop(name, None)
    tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        d = discover()
        out.put((rank, d.rank, d.world_size, d.source))
    finally:
        tdist.destroy_process_group()


def test_discovers_from_torch_distributed_gloo(tmp_path):
    # a file store, not a TCP port picked free and then bound: under xdist another test's
    # job could take that port between the two, and a rank then joined the wrong group
    # ("Connection closed by peer" in gloo's connectFullMesh, seen once in a fresh clone)
    mp.set_forkserver_preload(["torch", "loaders", __name__])  # no torch import per rank
    ctx = mp.get_context("forkserver")
    q = ctx.SimpleQueue()
    store = str(tmp_path / "store")
    mp.start_processes(_worker, args=(2, store, q), nprocs=2, join=True, start_method="forkserver")
    got = sorted(q.get() for _ in range(2))
    assert got == [(0, 0, 2, "torch.distributed"), (1, 1, 2, "torch.distributed")]


@pytest.mark.parametrize(("n", "world"), [(1001, 1), (1001, 2), (1001, 3), (10, 4)])
def test_shards_are_equal_disjoint_and_complete(n, world):
    shards = [shard_indices(n, r, world, seed=5, epoch=0) for r in range(world)]
    per_rank = -(-n // world)
    assert all(len(s) == per_rank for s in shards)
    together = np.concatenate(shards)
    assert set(together.tolist()) == set(range(n))
    # only the documented padding repeats: world * ceil(n / world) - n samples
    assert len(together) - len(set(together.tolist())) == per_rank * world - n


def test_order_changes_per_epoch_and_is_seeded():
    a0 = shard_indices(100, 0, 2, seed=1, epoch=0)
    a1 = shard_indices(100, 0, 2, seed=1, epoch=1)
    assert not np.array_equal(a0, a1)
    assert np.array_equal(a0, shard_indices(100, 0, 2, seed=1, epoch=0))
    assert not np.array_equal(a0, shard_indices(100, 0, 2, seed=2, epoch=0))
    assert np.array_equal(shard_indices(7, 1, 2, shuffle=False), np.array([1, 3, 5, 0]))
    assert len(shard_indices(7, 1, 2, drop_last=True)) == 3


@pytest.mark.parametrize(
    ("n", "world", "drop_last", "shuffle"),
    [(50, 3, False, True), (50, 3, True, True), (48, 4, True, True), (5, 8, False, True),
     (5, 8, True, True), (3, 8, False, False), (1, 1, False, True), (1000, 7, False, False)],
)  # fmt: skip
def test_shard_indices_are_distributed_samplers(n, world, drop_last, shuffle):
    """Every rank's indices, every epoch: those torch's DistributedSampler yields (padding more
    than n over many ranks, drop_last, no shuffle), as integer arrays."""
    from torch.utils.data.distributed import DistributedSampler

    for rank in range(world):
        sampler = DistributedSampler(
            range(n), world, rank, shuffle=shuffle, seed=7, drop_last=drop_last
        )
        for epoch in (0, 3):
            sampler.set_epoch(epoch)
            got = shard_indices(n, rank, world, shuffle=shuffle, seed=7, epoch=epoch,
                                drop_last=drop_last)  # fmt: skip
            assert got.dtype == np.int64 and got.tolist() == list(sampler)
