#!/usr/bin/env python3
"""Where a traced training step's GPU time goes, stream by stream.

Reads the CUDA kernel traces that `feedbench verify`'s worker writes with its diagnostic
`--trace-steps K` (trace-rankR.json.gz, Chrome trace format from torch.profiler) and prints, per
trace: the traced window, the time the GPU had at least one kernel running, and per stream the
kernel time, the kernel count, the time its kernels ran alone or beside another stream's, and its
heaviest kernels. Copies (memcpy / memset) are listed apart from kernels.

``--gaps N``: where the busiest stream (training's) sat idle between its own kernels and copies:
the idle time in gaps shorter and longer than ``--gap-us`` (short gaps: the GPU outrunning the
host's kernel launches), and the N longest gaps with the operations before and after them.

    python scripts/trace_streams.py benchmarks/2026-11-30-h200x2-run4/trace-dali-rank0.json.gz \
        --gaps 10
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict


def idle_gaps(rows: list, long_us: float, top: int) -> None:
    """The stream's idle time between consecutive operations (µs timestamps), printed."""
    rows = sorted(rows)
    gaps = []
    end, before = rows[0][1], rows[0][2]
    for a, b, name in rows[1:]:
        if a > end:
            gaps.append((a - end, end, before, name))
        if b > end:
            end, before = b, name
    short = sum(g for g, *_ in gaps if g < long_us)
    longer = [x for x in gaps if x[0] >= long_us]
    print(f"    idle between its operations: {(short + sum(g for g, *_ in longer)) / 1e3:.2f} ms;"
          f" in {len(gaps) - len(longer)} gaps < {long_us:g} µs: {short / 1e3:.2f} ms, in "
          f"{len(longer)} longer: {sum(g for g, *_ in longer) / 1e3:.2f} ms")  # fmt: skip
    t0 = rows[0][0]
    for g, at, before, after in sorted(sorted(gaps, reverse=True)[:top], key=lambda x: x[1]):
        print(f"      at {(at - t0) / 1e3:8.2f} ms: {g / 1e3:6.2f} ms idle after {before[:45]!r}"
              f" before {after[:45]!r}")  # fmt: skip


def summarize(path: str, top: int, gaps: int = 0, gap_us: float = 30.0) -> None:
    from feedbench.verify.worker.timing import (
        union_length as union,  # time covered by the intervals
    )

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels: dict[str, list] = defaultdict(list)
    copies: dict[str, list] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat = e.get("cat", "")
        stream = str(e.get("args", {}).get("stream", e.get("tid")))
        row = (float(e["ts"]), float(e["ts"]) + float(e["dur"]), e.get("name", "?"))
        if cat == "kernel":
            kernels[stream].append(row)
        elif cat in ("gpu_memcpy", "gpu_memset"):
            copies[stream].append(row)
    every = [r for rows in kernels.values() for r in rows]
    if not every:
        print(f"{path}: no kernels")
        return
    t0 = min(r[0] for r in every)
    t1 = max(r[1] for r in every)
    busy = union([(a, b) for a, b, _ in every])
    print(f"{path}: window {(t1 - t0) / 1e3:.1f} ms, some kernel running {busy / 1e3:.1f} ms "
          f"({busy / (t1 - t0):.1%})")  # fmt: skip
    by_time = sorted(kernels.items(), key=lambda kv: -sum(b - a for a, b, _ in kv[1]))
    busiest = by_time[0][0]
    for stream, rows in by_time:
        own = union([(a, b) for a, b, _ in rows])
        others = union([(a, b) for s, rs in kernels.items() if s != stream for a, b, _ in rs])
        both = own + others - union([(a, b) for a, b, _ in every])
        by_name: dict[str, float] = defaultdict(float)
        for a, b, name in rows:
            by_name[name] += b - a
        print(f"  stream {stream}: {len(rows)} kernels, {sum(b - a for a, b, _ in rows) / 1e3:.1f}"
              f" ms of kernels, {own / 1e3:.1f} ms busy, {both / 1e3:.1f} ms of it beside another"
              " stream's kernels")  # fmt: skip
        for name, d in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]:
            print(f"      {d / 1e3:8.2f} ms  {name[:110]}")
        if gaps and stream == busiest:
            idle_gaps(rows + copies.get(stream, []), gap_us, gaps)
    for stream, rows in sorted(copies.items()):
        print(f"  stream {stream}: {len(rows)} copies/sets, "
              f"{sum(b - a for a, b, _ in rows) / 1e3:.1f} ms")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=6, help="heaviest kernels listed per stream")
    p.add_argument("--gaps", type=int, default=0, help="longest idle gaps of the busiest stream")
    p.add_argument("--gap-us", type=float, default=30.0, help="short/long gap boundary, µs")
    args = p.parse_args()
    for path in args.traces:
        try:
            summarize(path, args.top, args.gaps, args.gap_us)
        except (OSError, ValueError, KeyError, TypeError) as e:  # not a trace: one line, exit 2
            why = (
                e.strerror if isinstance(e, OSError) and e.strerror else f"not a Chrome trace ({e})"
            )
            print(f"error: {path}: {why}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main()
