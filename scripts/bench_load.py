#!/usr/bin/env python3
"""How long loading results files takes (``feedbench report``/``compare``/``plan`` read them).

    python scripts/bench_load.py [FILES_OR_FOLDERS ...] [--repeat N]

Default: every results file kept under benchmarks/. Each repeat loads every file once (in this
process: the schema's caches warm after the first file); prints each repeat's total, then the
slowest files of the last repeat. Files that are not feedbench results (say a DLIO summary) are
counted apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from feedbench.core.errors import FeedbenchError  # noqa: E402
from feedbench.report.kinds import load_any  # noqa: E402


def files(args: list[str]) -> list[Path]:
    roots = [Path(a) for a in args] or [Path(__file__).resolve().parents[1] / "benchmarks"]
    out: list[Path] = []
    for r in roots:
        out += sorted(p for p in r.rglob("*.json*") if p.is_file()) if r.is_dir() else [r]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("paths", nargs="*")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    paths = files(args.paths)
    totals, last = [], []
    for _ in range(args.repeat):
        last, other = [], 0
        t0 = time.perf_counter()
        for path in paths:
            t = time.perf_counter()
            try:
                load_any(path)
            except FeedbenchError:
                other += 1
            last.append((time.perf_counter() - t, path))
        totals.append(time.perf_counter() - t0)
    size = sum(p.stat().st_size for p in paths) / 1e6
    print(f"{len(paths)} files ({size:.1f} MB as stored; {other} not feedbench results)")
    print("each repeat, s: " + ", ".join(f"{t:.2f}" for t in totals)
          + f"; median {statistics.median(totals):.2f}")  # fmt: skip
    for t, path in sorted(last, key=lambda x: x[0], reverse=True)[:5]:
        print(f"  {t * 1e3:7.1f} ms  {path.name} ({path.stat().st_size / 1e3:.0f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
