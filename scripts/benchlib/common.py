"""What every part of bench_scan shares: constants, logging, ratios and the results writer."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from feedbench.core.stats import spread

READ_CHUNK = 1 << 20  # loaders.data.readers.READ_CHUNK: feedbench reads with 1 MiB read() calls
FEEDBENCH_BATCH = 64  # feedbench scan's batch without a profile; its steady rate skips one batch
GOAL = 0.9


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """Ratio of the means of two ``spread`` summaries; None when either is missing or zero."""
    if not a or not b or not a.get("mean") or not b.get("mean"):
        return None
    return a["mean"] / b["mean"]


def paired(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """Per-repeat ratios x_i / y_i of interleaved runs (drift of the storage cancels out)."""
    return spread([x / y for x, y in zip(xs, ys, strict=False) if x and y])


def save(res: dict[str, Any], out: Path) -> None:
    """Write the results JSON atomically (temp file + rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, out)


def cpu(fn, repeats: int = 5) -> float:
    """The median process time of ``fn()`` over ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)
