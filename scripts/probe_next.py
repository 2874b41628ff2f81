#!/usr/bin/env python3
"""Where the training thread's ``next()`` goes at a small batch (issue 29), per loader.

The training thread spends 0.7–1.7 ms a step in ``next()`` at 64 per GPU (scripts/diag_step.py):
2–5% of a launch-bound ResNet-50 step. This trains ResNet-50 (DDP of one rank, as diag_step) on
each loader in turn and times, inside ``next()``, the library functions it calls (wrapped with a
clock: DataLoader's hand-over, the copy and normalisation, DALI's iterator, its outputs' sharing
and copies, the loader's own bookkeeping). Per loader: ms per step of each, and calls per step.

    python scripts/probe_next.py --data /tmp/fb32k --batch 64 --steps 150 --out probe64.json

Device only (CUDA); not part of the product.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import importlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import diag_step  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SPENT: collections.Counter = collections.Counter()
CALLS: collections.Counter = collections.Counter()

# (module, attribute path, label): plain functions and methods only (not generators)
DL, IT = "torch.utils.data.dataloader", "_MultiProcessingDataLoaderIter"
TARGETS = [
    (DL, f"{IT}._next_data", "dl._next_data"),
    (DL, f"{IT}._get_data", "dl._get_data"),
    (DL, f"{IT}._try_put_index", "dl.put_index"),
    (DL, f"{IT}._process_data", "dl.process"),
    ("loaders.transforms", "Normalize.__call__", "normalize"),
    ("loaders.transforms", "BatchOutput.__call__", "batch_output"),
    ("loaders.slots", "BatchSlots.copied", "slots.copied"),
    ("loaders.slots", "BatchSlots.hand_back", "slots.hand_back"),
    ("loaders.dali_feed", "DealtFiles.__call__", "dali.source"),
    ("loaders.wds_backend", "rebatch", "wds.rebatch(gen)"),
    ("loaders.dali_backend", "DaliLoader._outputs", "dali._outputs"),
    ("nvidia.dali.plugin.pytorch", "DALIGenericIterator.__next__", "dali.iter.__next__"),
    ("nvidia.dali.plugin.base_iterator", "_DaliBaseIterator._get_outputs", "dali.get_outputs"),
    ("nvidia.dali.plugin.base_iterator", "_DaliBaseIterator._schedule_runs", "dali.schedule_runs"),
    ("nvidia.dali.pipeline", "Pipeline.share_outputs", "dali.share_outputs"),
    ("nvidia.dali.pipeline", "Pipeline.release_outputs", "dali.release_outputs"),
    ("nvidia.dali.pipeline", "Pipeline.schedule_run", "dali.schedule_run"),
    ("nvidia.dali.plugin.pytorch", "feed_ndarray", "dali.feed_ndarray"),
]


def wrap(owner, name: str, label: str) -> bool:
    orig = getattr(owner, name, None)
    if orig is None or not callable(orig):
        return False

    @functools.wraps(orig)
    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            SPENT[label] += time.perf_counter() - t0
            CALLS[label] += 1

    setattr(owner, name, timed)
    return True


def install() -> list[str]:
    done = []
    for module, path, label in TARGETS:
        if label.endswith("(gen)"):
            continue  # a generator's time is its consumer's: not wrapped
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
            if owner is None:
                break
        if owner is not None and wrap(owner, name, label):
            done.append(label)
    return done


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--skip", type=int, default=20)
    p.add_argument("--loaders", default="torch,wds,dali")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.images, args.shards = os.path.join(args.data, "images"), os.path.join(args.data, "shards")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    wrapped = install()
    print("wrapped:", ", ".join(wrapped), flush=True)
    trainer = diag_step.Trainer(args.batch, device)
    for _ in range(30):
        trainer.step(*trainer.synthetic)
    results = {}
    for name in args.loaders.split(","):
        loader, batches = diag_step.open_batches(name, args, device)
        for _ in range(args.skip):  # start-up out of the measured steps
            images, labels = next(batches)
            trainer.step(images, labels.long() % 1000)
        SPENT.clear()
        CALLS.clear()
        res = trainer.block(batches, args.steps, 0)
        n = args.steps
        parts = {k: round(1e3 * v / n, 3) for k, v in sorted(SPENT.items())}
        calls = {k: round(v / n, 2) for k, v in sorted(CALLS.items())}
        results[name] = {**res, "ms_per_step": parts, "calls_per_step": calls}
        print(f"{name}: step {res['step_ms']:.2f} ms, next {res['next_ms']:.3f} ms", flush=True)
        for k, v in parts.items():
            print(f"    {k:22s} {v:7.3f} ms/step  ({calls[k]} calls/step)", flush=True)
        with contextlib.suppress(Exception):
            loader.close()
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    os._exit(0)


if __name__ == "__main__":
    main()
