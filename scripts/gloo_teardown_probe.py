"""Does a gloo process group outlive destroy_process_group? One process, one group, one DDP model.

    python scripts/gloo_teardown_probe.py late    # torch._dynamo imported by DDP's constructor
    python scripts/gloo_teardown_probe.py early   # imported before init_process_group

Prints the group's refcount at each step and the threads left after destroy_process_group and
``del``. On torch 2.14.1 (see BENCHMARKS.md), ``late`` leaves gloo's threads running until
interpreter exit; ``early`` leaves none. Why examples/imagenet_ddp.py imports torch._dynamo first.
"""

from __future__ import annotations

import gc
import socket
import sys
from pathlib import Path


def threads() -> str:
    return " ".join(sorted(p.read_text().strip() for p in Path("/proc/self/task").glob("*/comm")))


def main(order: str) -> None:
    import torch

    if order == "early":
        import torch._dynamo  # noqa: F401
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    pg = dist.group.WORLD
    print(f"{order}: refcount after init_process_group {sys.getrefcount(pg)}")
    model = DDP(torch.nn.Linear(4, 2))
    print(f"{order}: refcount with a DDP model {sys.getrefcount(pg)}")
    del model
    gc.collect()
    print(f"{order}: refcount after del model {sys.getrefcount(pg)}")
    dist.destroy_process_group()
    del pg
    gc.collect()
    print(f"{order}: threads after destroy_process_group and del: {threads()}")


if __name__ == "__main__":
    if sys.argv[1:] not in (["early"], ["late"]):
        sys.exit("usage: gloo_teardown_probe.py early|late")
    main(sys.argv[1])
