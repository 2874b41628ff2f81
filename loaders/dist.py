"""Rank, local rank and world discovery, and DistributedSampler-exact sharding.

The GLOBAL rank picks the shard; the LOCAL rank picks the GPU. Mixing them up is the classic
multi-node bug (DALI's own examples pass the local rank as ``shard_id``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class DistInfo:
    rank: int  # global rank: which shard of the data
    world_size: int
    local_rank: int  # rank within this node: which GPU
    local_world_size: int
    source: str  # "arguments", "environment", "torch.distributed" or "default"

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from e


def discover(
    rank: int | None = None, world_size: int | None = None, local_rank: int | None = None
) -> DistInfo:
    """Rank and world from the arguments, else torchrun's environment, else torch.distributed.

    Arguments win over the environment field by field; nothing silently overrides an argument.
    """
    source = "default"
    env = {n: _env_int(n) for n in _ENV}
    dist_rank = dist_world = None
    try:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            dist_rank, dist_world = tdist.get_rank(), tdist.get_world_size()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass

    if rank is not None or world_size is not None:
        source = "arguments"
    elif env["RANK"] is not None or env["WORLD_SIZE"] is not None:
        source = "environment"
    elif dist_rank is not None:
        source = "torch.distributed"

    def pick(arg: int | None, env_value: int | None, dist_value: int | None, default: int) -> int:
        for v in (arg, env_value, dist_value):
            if v is not None:
                return v
        return default

    r = pick(rank, env["RANK"], dist_rank, 0)
    w = pick(world_size, env["WORLD_SIZE"], dist_world, 1)
    # without a LOCAL_RANK anywhere, assume one node: the local rank is the global rank
    lr = pick(local_rank, env["LOCAL_RANK"], None, r)
    lw = pick(None, env["LOCAL_WORLD_SIZE"], None, w)
    if w < 1:
        raise ValueError(f"world size must be at least 1, got {w}")
    if not 0 <= r < w:
        raise ValueError(f"rank {r} is outside world size {w}")
    if lr < 0:
        raise ValueError(f"local rank must be ≥ 0, got {lr}")
    return DistInfo(r, w, lr, max(lw, lr + 1), source)


def shard_indices(
    n: int,
    rank: int,
    world_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> np.ndarray:
    """The sample indices rank ``rank`` reads in ``epoch``: exactly torch's DistributedSampler.

    Every rank gets ``ceil(n / world)`` indices (padded by repeating from the start) or
    ``floor(n / world)`` with ``drop_last``; the order is a permutation seeded by seed + epoch.
    """
    from torch.utils.data.distributed import DistributedSampler

    if n < 1:
        raise ValueError("cannot shard an empty dataset")
    sampler = DistributedSampler(
        range(n),
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
    )
    sampler.set_epoch(epoch)
    return np.fromiter(iter(sampler), dtype=np.int64)


def eval_indices(n: int, rank: int, world_size: int) -> np.ndarray:
    """The sample indices rank ``rank`` evaluates: a contiguous range, no padding, no shuffle.

    The ranges cover ``0 … n − 1`` exactly once and differ in length by at most one (ranks
    get ``floor`` or ``ceil`` of ``n / world``), as detectron2's InferenceSampler splits; the
    bounds are DALI's (``n·r // world``), so every backend's eval split is the same.
    """
    if n < 1:
        raise ValueError("cannot shard an empty dataset")
    return np.arange(n * rank // world_size, n * (rank + 1) // world_size, dtype=np.int64)


def default_workers(local_world_size: int, *, reserve: int = 0, minimum: int = 1) -> int:
    """THE default number of loader workers (DALI: threads) for a rank: its share of the cores
    this process may run on, less ``reserve`` cores kept for the rank's own work, and at least
    ``minimum`` (0: the rank loads in its own process)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(minimum, cores // max(1, local_world_size) - reserve)
