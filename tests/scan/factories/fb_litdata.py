"""LitData over a local directory written by ``litdata.optimize``, through its own
``StreamingDataLoader``
(``feedbench scan OPT_DIR --loader tests/scan/factories/fb_litdata.py:make_loader``).

LitData takes the world from torch.distributed (initialised in a feedbench consumer), but lets
WORLD_SIZE and GLOBAL_RANK in the environment override it, and counts a node per GPU when CUDA
is present; the factory states all three from feedbench's keywords so each consumer reads its
own part whatever the environment holds.
"""

import os

from litdata import StreamingDataLoader, StreamingDataset


def make_loader(path, rank, world_size, batch_size, workers, seed, shuffle=False):
    os.environ.update(WORLD_SIZE=str(world_size), GLOBAL_RANK=str(rank))
    nodes = world_size // int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    os.environ["NNODES"] = str(max(1, nodes))
    dataset = StreamingDataset(path, shuffle=shuffle, seed=seed)
    return StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers)
