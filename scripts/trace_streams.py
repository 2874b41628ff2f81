#!/usr/bin/env python3
"""Where a traced training step's GPU time goes, stream by stream.

Reads the CUDA kernel traces that `feedbench verify`'s worker writes with its diagnostic
`--trace-steps K` (trace-rankR.json.gz, Chrome trace format from torch.profiler) and prints, per
trace: the traced window, the time the GPU had at least one kernel running, and per stream the
kernel time, the kernel count, the time its kernels ran alone or beside another stream's, and its
heaviest kernels. Copies (memcpy / memset) are listed apart from kernels.

    python scripts/trace_streams.py benchmarks/2026-11-30-h200x2/trace/trace-rank0.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict


def summarize(path: str, top: int) -> None:
    from feedbench.verify_worker import union_length as union  # time covered by the intervals

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
    for stream, rows in sorted(kernels.items(), key=lambda kv: -sum(b - a for a, b, _ in kv[1])):
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
    for stream, rows in sorted(copies.items()):
        print(f"  stream {stream}: {len(rows)} copies/sets, "
              f"{sum(b - a for a, b, _ in rows) / 1e3:.1f} ms")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=6, help="heaviest kernels listed per stream")
    args = p.parse_args()
    for path in args.traces:
        try:
            summarize(path, args.top)
        except (OSError, ValueError, KeyError, TypeError) as e:  # not a trace: one line, exit 2
            why = (
                e.strerror if isinstance(e, OSError) and e.strerror else f"not a Chrome trace ({e})"
            )
            print(f"error: {path}: {why}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main()
