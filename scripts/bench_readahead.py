#!/usr/bin/env python3
"""Cold one-stream shard pass, with and without a sliding FADV_WILLNEED window ahead of the reads.

For the one-consumer shard read (issue 3): does asking the kernel to read ahead (`feedbench scan
--read-ahead MIB`) keep the disk busy while Python walks the tar headers? Every round evicts the
shards from the page cache (``feedbench.scan.cache.evict``), then reads them all with
``ShardSource.iter_samples`` (the scan's read path, reads in series with the walk as with
``--no-read-thread``), once per window size, interleaved. MB/s per
round and the mean. Prints the device's own read-ahead (sysfs), which decides what a window adds.

    python scripts/bench_readahead.py /tmp/ds2k/shards --windows 0,4,16 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("shards", help="a folder of .tar shards")
    p.add_argument("--windows", default="0,4,16", help="MiB ahead of the read position (0: none)")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    from feedbench.scan.cache import device_read_ahead, evict
    from feedbench.scan.sources import detect

    src, _ = detect(args.shards, "shards")
    files = [str(f) for f in src.files()]
    total = sum(os.path.getsize(f) for f in files)
    units = np.arange(src.units())
    known = device_read_ahead(files[0])
    print(
        f"{len(files)} shards, {total / 1e6:,.0f} MB; the device's read_ahead_kb, max_sectors_kb: "
        + (f"{known[0] >> 10}, {known[1] >> 10}" if known else "unknown (not a block device)")
    )
    windows = [int(w) << 20 for w in args.windows.split(",")]
    rates: dict[int, list[float]] = {w: [] for w in windows}
    for _ in range(args.rounds):
        for w in windows:
            src.set_options(read_ahead=w)
            evict(files)
            time.sleep(0.5)
            t0 = time.perf_counter()
            for _ in src.iter_samples(units, views=True):
                pass
            rates[w].append(total / (time.perf_counter() - t0) / 1e6)
    for w, xs in rates.items():
        print(
            f"{w >> 20:3d} MiB window: " + " ".join(f"{x:,.0f}" for x in xs)
            + f" MB/s, mean {np.mean(xs):,.0f}"
        )  # fmt: skip


if __name__ == "__main__":
    main()
