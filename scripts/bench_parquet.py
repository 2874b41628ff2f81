#!/usr/bin/env python3
"""Decode rate of Parquet samples, one process, the samples' bytes already in memory.

Writes Parquet files of a fixed shape (seeded), lists them as ``parquet`` (a row group per
sample) and ``parquet:rows=N``, reads every sample once, then times decoding them all
``--passes`` times in seeded shuffled orders (as epochs do), ``--repeat`` times (the footer
cache emptied before each repeat, so the first sample of each file pays its parse). Prints
samples/s as mean ± std, over wall time and over the process's CPU time (steadier on a shared
host; pyarrow may decode on more than one thread), and the bytes read,
which the footer cache must not change, and the memory a parsed footer takes (what the cache's
budget stands for). To compare with the code before a change, run it with
that code first on ``PYTHONPATH``:

    python scripts/bench_parquet.py --repeat 3
    PYTHONPATH=/path/to/old/worktree python scripts/bench_parquet.py --repeat 3
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def write_files(folder: Path, files: int, groups: int, group_rows: int, columns: int) -> None:
    """``files`` files of ``groups`` row groups of ``group_rows`` rows: int, float and string
    columns in turn, ``columns`` in all."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = groups * group_rows
    for k in range(files):
        cols = {}
        for c in range(columns):
            kind = c % 3
            if kind == 0:
                cols[f"i{c}"] = rng.integers(0, 1 << 40, n)
            elif kind == 1:
                cols[f"x{c}"] = rng.random(n)
            else:
                cols[f"s{c}"] = [f"value {v}" for v in rng.integers(0, 10_000, n)]
        pq.write_table(pa.table(cols), folder / f"part-{k:03d}.parquet", row_group_size=group_rows)


def decode_rates(folder: Path, fmt: str, repeat: int, passes: int):
    """Samples/s of each repeat over wall and over CPU time, the samples and the bytes read."""
    from feedbench.scan.sources import detect
    from loaders.data import columnar

    source, _ = detect(str(folder), fmt)
    samples = list(source.iter_samples(range(source.units())))
    assert all(s.error is None for s in samples), [s.error for s in samples if s.error][:1]
    rng = np.random.default_rng(1)
    order = np.concatenate([rng.permutation(len(samples)) for _ in range(passes)])
    footers = getattr(columnar, "FOOTERS", None)  # the code before the cache has none
    wall, cpu = [], []
    for _ in range(repeat):
        if footers is not None:
            footers.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        for i in order:
            source.decode(samples[i])
        wall.append(len(order) / (time.perf_counter() - t0))
        cpu.append(len(order) / (time.process_time() - c0))
    return wall, cpu, len(samples), sum(s.read_bytes for s in samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--groups", type=int, default=32, help="row groups per file")
    p.add_argument("--group-rows", type=int, default=512)
    p.add_argument("--columns", type=int, default=12)
    p.add_argument("--rows", type=int, default=64, help="N of parquet:rows=N")
    p.add_argument("--passes", type=int, default=4, help="decodes of every sample per repeat")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-parquet-") as tmp:
        folder = Path(tmp)
        write_files(folder, args.files, args.groups, args.group_rows, args.columns)
        footer = sum(_footer_bytes(f) for f in sorted(folder.iterdir())) // args.files
        print(f"{args.files} files × {args.groups} row groups × {args.group_rows} rows, "
              f"{args.columns} columns, footer {footer:,} bytes each")  # fmt: skip
        rss = _parsed_rss(next(folder.iterdir()))
        print(f"a parsed footer takes {rss:,.0f} bytes of RSS ({rss / footer:.1f}x its bytes)")
        for fmt in ("parquet", f"parquet:rows={args.rows}"):
            wall, cpu, n, nbytes = decode_rates(folder, fmt, args.repeat, args.passes)
            print(f"{fmt:18s} {_spread(wall)} samples/s decoded, {_spread(cpu)} per CPU s "
                  f"({n:,} samples × {args.passes} passes, {nbytes:,} bytes read, "
                  f"{args.repeat} repeats)")  # fmt: skip


def _spread(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):7,.0f} ± {std:5,.0f}"


def _parsed_rss(path: Path, copies: int = 200) -> float:
    """Resident bytes per parsed footer of ``path``, over ``copies`` parses kept alive."""
    import psutil
    import pyarrow.parquet as pq

    data = path.read_bytes()
    footer = b"PAR1" + data[-_footer_bytes(path) - 8 :]
    me = psutil.Process()
    before = me.memory_info().rss
    held = [pq.read_metadata(io.BytesIO(footer)) for _ in range(copies)]
    return (me.memory_info().rss - before) / len(held)


def _footer_bytes(path: Path) -> int:
    with open(path, "rb") as f:
        f.seek(-8, 2)
        return int.from_bytes(f.read(4), "little")


if __name__ == "__main__":
    main()
