"""MosaicML Streaming over a local MDS directory (written with ``streaming.MDSWriter``), through a
DataLoader: ``feedbench scan MDS_DIR --loader tests/scan/factories/fb_mds.py:make_loader``.

Streaming reads who it is from the environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
not from torch.distributed: a consumer started by feedbench (not torchrun) has none of them, so
the factory sets them from feedbench's keywords, else every consumer would read the whole set.
"""

import os

from torch.utils.data import DataLoader


def make_loader(path, rank, world_size, local_rank, batch_size, workers, seed, shuffle=False):
    from streaming import StreamingDataset

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    # one host unless a launcher (torchrun) says how many ranks this host has
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(world_size))
    dataset = StreamingDataset(local=path, batch_size=batch_size, shuffle=shuffle,
                               shuffle_seed=seed)  # fmt: skip
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers)
