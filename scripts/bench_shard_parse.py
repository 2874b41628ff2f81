#!/usr/bin/env python3
"""CPU cost per sample of feedbench's shard read path, warm page cache, one process.

Four loops over the same shards (best of --repeat, µs per sample): the bare read calls
(1 MiB ``readv`` into one buffer, what fio does), ``Source.iter_samples`` with a copy of every
image, and with ``views=True`` (what a scan's consumers use); the difference to the bare reads is
the tar walk and bookkeeping that run in series with the reads on a fast source. The fourth walks
the shards from memory (no read call at all): the tar walker's own cost.

    python scripts/bench_shard_parse.py /tmp/ds2k/shards --repeat 9
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

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

    from loaders.data.readers import READ_CHUNK, StreamBase
    from loaders.data.tar import iter_shard

    held = {str(f): Path(str(f)).read_bytes() for f in src.files()}

    class InMemory(StreamBase):
        """The reader interface over bytes already in memory, 1 MiB at a time."""

        def __init__(self, data: bytes) -> None:
            self._init_stream()
            self._data, self._at = memoryview(data), 0

        def fill(self) -> None:
            if type(self.hold[0]) is memoryview:
                self.hold[0] = bytes(self.hold[0])
            self.base += self.end
            chunk = self._data[self._at : self._at + READ_CHUNK]
            self._at += len(chunk)
            self.buf, self.pos, self.end = chunk, 0, len(chunk)
            self.bytes += len(chunk)
            self.eof = not len(chunk)

    def in_memory() -> None:
        for path, data in held.items():
            for _ in iter_shard(InMemory(data), path, views=True):
                pass

    loops = {
        "bare 1 MiB reads": bare,
        "walk in memory, views": in_memory,
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
