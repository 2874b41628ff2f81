#!/usr/bin/env python3
"""The training process's garbage collections while a loader feeds it (issue 29).

A full (generation-2) collection walks every container object the process holds: with torch,
torchvision and a ResNet-50 built, ~340k of them, 60–120 ms on the machines measured. If one runs
inside the training loop it is a stall of that length, and if it runs inside ``next()`` it is
counted as waiting for data. This iterates a loader (or synthetic batches) in a process that has
built the model, and records every collection: its generation, its length, and whether it ran
inside ``next()``. Runs on the CPU (no training step) or, with ``--device cuda``, anywhere.

    python scripts/probe_gc.py --data /tmp/gcdata --loader synthetic,torch,wds -b 64 --steps 2000

Not part of the product.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


class Collections:
    """gc.callbacks: each collection's generation, milliseconds, and whether inside next()."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, bool]] = []
        self.in_next = False
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.rows.append(
                (info["generation"], (time.perf_counter() - self._t0) * 1e3, self.in_next)
            )

    def summary(self, steps: int) -> dict:
        out = {}
        for gen in (0, 1, 2):
            ms = [r[1] for r in self.rows if r[0] == gen]
            inside = [r[1] for r in self.rows if r[0] == gen and r[2]]
            out[f"gen{gen}"] = {
                "count": len(ms),
                "per_1000_steps": round(1000 * len(ms) / steps, 2),
                "total_ms": round(sum(ms), 1),
                "max_ms": round(max(ms), 2) if ms else 0.0,
                "inside_next": len(inside),
                "ms_per_step": round(sum(ms) / steps, 4),
            }
        return out


def synthetic(batch: int, size: int):
    while True:
        yield torch.empty(batch, 3, size, size), torch.zeros(batch, dtype=torch.long)


def run(name: str, args, population) -> dict:
    from loaders import build_loader

    if name == "synthetic":
        it = synthetic(args.batch, args.image_size)
    else:
        sub = "shards" if name == "wds" else "images"  # feedbench sample's two formats
        loader = build_loader(
            os.path.join(args.data, sub),
            name,
            args.batch,
            image_size=args.image_size,
            workers=args.workers,
            device=args.device,
            drop_last=True,
        )
        loader_epochs = _epochs(loader)
        it = loader_epochs
    for _ in range(args.warmup):
        next(it)
    gc.collect()  # every condition starts from the same collector state
    probe = Collections()
    gc.callbacks.append(probe)
    t0 = time.perf_counter()
    try:
        for _ in range(args.steps):
            probe.in_next = True
            batch = next(it)
            probe.in_next = False
            _use(batch)
    finally:
        gc.callbacks.remove(probe)
    wall = time.perf_counter() - t0
    return {
        "loader": name,
        "steps": args.steps,
        "wall_s": round(wall, 2),
        "tracked_objects": len(gc.get_objects()),
        **probe.summary(args.steps),
    }


def _epochs(loader):
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def _use(batch) -> None:
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    images.sum()  # the step touches the batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--loader", default="synthetic,torch,wds")
    p.add_argument("-b", "--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out")
    args = p.parse_args()
    global torch
    import torch
    import torchvision

    population = torchvision.models.resnet50()  # the training process's objects
    print(f"threshold {gc.get_threshold()}, python {sys.version.split()[0]}")
    rows = []
    for name in args.loader.split(","):
        r = run(name, args, population)
        rows.append(r)
        g = [r[f"gen{i}"] for i in (0, 1, 2)]
        print(
            f"{r['loader']:>9}: {r['tracked_objects']:,} objects; gen2 {g[2]['count']} "
            f"({g[2]['inside_next']} in next(), max {g[2]['max_ms']} ms), "
            f"gen1 {g[1]['per_1000_steps']}/1000 steps, gen0 {g[0]['per_1000_steps']}/1000; "
            f"collector {sum(x['ms_per_step'] for x in g):.3f} ms a step",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
