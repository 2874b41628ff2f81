#!/usr/bin/env python3
"""The DALI loader's ``next()`` on a machine without a GPU: its host time a batch, and the parts
of it (DALI's ``schedule_run`` with the dealt source's callback, ``share_outputs``, the backend's
``_outputs``), on a CPU pipeline training on an image tree (the dealt path, issue 29).

    python scripts/probe_dali_next_cpu.py /tmp/fb2k/images --batch 64 --steps 60

A pause before each ``next()`` lets DALI's threads finish the next batch, so what is timed is the
hand-over, not the decode. The GPU host's figures come from scripts/probe_next.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_next import CALLS, SPENT, wrap  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("tree", help="a tree of JPEGs (feedbench sample's images/)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pause", type=float, default=0.15, help="s before each next()")
    args = p.parse_args()
    import nvidia.dali.pipeline as pipeline

    import loaders
    import loaders.dali_backend as backend
    import loaders.dali_feed as feed

    wrap(feed.DealtFiles, "__call__", "dealt source")
    wrap(pipeline.Pipeline, "schedule_run", "schedule_run")
    wrap(pipeline.Pipeline, "share_outputs", "share_outputs")
    wrap(pipeline.Pipeline, "release_outputs", "release_outputs")
    wrap(backend.DaliLoader, "_outputs", "_outputs")
    loader = loaders.build_loader(
        args.tree, "dali", args.batch, device="cpu", workers=args.threads,
        rank=0, world_size=1, local_rank=0,
    )  # fmt: skip

    def endless():
        while True:
            yield from loader

    batches = endless()
    for _ in range(5):  # start-up
        next(batches)
    SPENT.clear()
    CALLS.clear()
    spent = []
    for _ in range(args.steps):
        time.sleep(args.pause)
        t0 = time.perf_counter()
        next(batches)
        spent.append(time.perf_counter() - t0)
    spent.sort()
    n = len(spent)
    print(
        f"next() ms: p10 {1e3 * spent[n // 10]:.3f}  p50 {1e3 * spent[n // 2]:.3f}  "
        f"p90 {1e3 * spent[9 * n // 10]:.3f}"
    )
    for k in SPENT:
        print(f"  {k:16s} {1e3 * SPENT[k] / CALLS[k]:.3f} ms a call ({CALLS[k]} calls)")
    sys.stdout.flush()
    os._exit(0)  # DALI's pipeline torn down at exit would only add noise


if __name__ == "__main__":
    main()
