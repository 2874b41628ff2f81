#!/usr/bin/env python3
"""How long scan's listing sweep takes in a crowded temporary folder.

Each scan, before it lists, removes listing folders that ended scans left behind
(:func:`feedbench.scan.sources.sweep_listings`): one pass over the temporary folder's entries.
This fills a fresh folder with ``--entries`` unrelated files and ``--stale`` abandoned listing
folders (lock free, one small file each), then times the sweep that removes them and a second
one that finds nothing left.

    python scripts/probe_sweep.py --entries 200000 --stale 1000 --dir /work

Not part of the product.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from feedbench.scan.sources import LISTING_LOCK, LISTING_PREFIX, sweep_listings  # noqa: E402


def fill(folder: str, entries: int, stale: int) -> None:
    for i in range(entries):
        open(os.path.join(folder, f"other-{i}"), "w").close()
    for i in range(stale):
        listing = os.path.join(folder, f"{LISTING_PREFIX}{i}")
        os.mkdir(listing)
        open(os.path.join(listing, LISTING_LOCK), "w").close()
        with open(os.path.join(listing, "layout.json"), "w") as f:
            f.write("{}" * 500)


def timed_sweep(folder: str) -> tuple[int, float]:
    t = time.perf_counter()
    removed = sweep_listings(folder)
    return removed, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=200_000, help="unrelated files in the folder")
    ap.add_argument("--stale", type=int, default=1000, help="abandoned listing folders")
    ap.add_argument("--dir", default=None, help="where to make the folder (default: the temp dir)")
    args = ap.parse_args()
    if args.entries < 0 or args.stale < 1:
        ap.error("--entries takes 0 or more, --stale 1 or more")
    try:
        folder = tempfile.mkdtemp(prefix="probe-sweep-", dir=args.dir)
    except OSError as e:
        print(f"error: cannot make a folder in {args.dir}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        fill(folder, args.entries, args.stale)
        removed, first = timed_sweep(folder)
        again, second = timed_sweep(folder)
        print(
            f"{args.entries} other entries, {args.stale} stale listings: removed {removed} "
            f"in {first:.3f} s; a second sweep removed {again} in {second:.3f} s"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if removed == args.stale and again == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
