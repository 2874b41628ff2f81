#!/usr/bin/env python3
"""CPU cost per sample of feedbench's shard read path, warm page cache, one process.

Three loops over the same shards (best of --repeat, µs per sample): the bare read calls
(1 MiB ``readv`` into one buffer, what fio does), ``ShardSource.iter_samples`` with a copy of
every image, and with ``views=True`` (what a scan's consumers use). The difference to the bare
reads is the tar walk and bookkeeping that run in series with the reads on a fast source.

    python scripts/bench_shard_parse.py /tmp/ds2k/shards --repeat 9
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("shards", help="a folder of .tar shards")
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args()
    from feedbench.scan.sources import detect

    src, _ = detect(args.shards, "shards")
    units = np.arange(src.units())
    n = sum(1 for _ in src.iter_samples(units))  # also warms the page cache

    def bare() -> None:
        mv = memoryview(bytearray(1 << 20))
        for f in src.files():
            fd = os.open(str(f), os.O_RDONLY)
            while os.readv(fd, [mv]) > 0:
                pass
            os.close(fd)

    loops = {
        "bare 1 MiB reads": bare,
        "iter_samples, copies": lambda: [None for _ in src.iter_samples(units)],
        "iter_samples, views": lambda: [None for _ in src.iter_samples(units, views=True)],
    }
    for name, fn in loops.items():
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        print(f"{name:24s} {best / n * 1e6:7.2f} µs/sample  ({n} samples, best of {args.repeat})")


if __name__ == "__main__":
    main()
