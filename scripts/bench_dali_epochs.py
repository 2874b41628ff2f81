#!/usr/bin/env python3
"""The DALI loader's throughput per epoch and its epoch boundary (issue 26): a tree or shards.

Runs a training loop the way a script does (``loader.sampler.set_epoch(e)`` then a full pass,
every batch summed so it is used before the next) for ``--epochs`` epochs, and prints one JSON
line: per epoch the images per second, the images per CPU second of this process (all its
threads: less swayed than the rate by other work on a shared machine), the time to its first
batch (from ``iter()``; epoch 0 includes building the pipeline), the median batch time, and
the boundary cost (first batch minus the median). Examples::

    # the 2-core dev VM (BENCHMARKS.md, "DALI's order per epoch (issue 26)")
    feedbench sample /tmp/i26c --images 4000 --seed 0 --format tree
    python scripts/bench_dali_epochs.py /tmp/i26c/images --device cpu --workers 2 --batch 64
    # shards (a pipeline per epoch: BENCHMARKS.md, "DALI's shard order per epoch (issue 26)")
    feedbench sample /tmp/i26d --images 4000 --seed 0 --per-shard 250
    python scripts/bench_dali_epochs.py /tmp/i26d/shards --device cpu --workers 2 --batch 64 \
        --epochs 3
    # a GPU box (16 cores, one H200)
    python scripts/bench_dali_epochs.py data/images --device cuda --workers 16 --batch 256 \
        --epochs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a JPEG class-folder tree or a folder of shards")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=2, help="DALI CPU threads")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    args = ap.parse_args()

    import torch

    from loaders import build_loader

    loader = build_loader(
        args.source,
        "dali",
        args.batch,
        device=args.device,
        workers=args.workers,
        image_size=args.image_size,
    )
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    epochs = []
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        times = []
        images = 0
        cpu0 = time.process_time()  # every thread of this process: DALI's too
        t0 = last = time.perf_counter()
        for batch in loader:
            float(batch[0].float().sum())  # use the batch before the next (DALI reuses buffers)
            sync()
            now = time.perf_counter()
            times.append(now - last)
            last = now
            images += len(batch[1])
        wall = last - t0
        cpu = time.process_time() - cpu0
        median = statistics.median(times[1:]) if len(times) > 1 else times[0]
        epochs.append(
            {
                "epoch": epoch,
                "images": images,
                "img_s": round(images / wall, 1),
                "img_per_cpu_s": round(images / cpu, 1),
                "first_batch_s": round(times[0], 3),
                "median_batch_s": round(median, 3),
                "boundary_s": round(times[0] - median, 3),
            }
        )
    loader.close()
    out = {"device": args.device, "workers": args.workers, "batch": args.batch, "epochs": epochs}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
