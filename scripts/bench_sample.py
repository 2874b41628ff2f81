#!/usr/bin/env python3
"""How fast ``feedbench sample`` writes, against ``dd`` to the same disk in the same run.

    python scripts/bench_sample.py [--dir DIR] [--images 4000] [--jobs N] [--cwd CHECKOUT]
                                   [--out FILE]

In order: ``dd`` of zeros with ``oflag=direct`` and with ``conv=fdatasync`` (the page-cache path
feedbench writes through), ``feedbench sample --images N`` (tree and shards, then shards only),
a plain writer of the tree's files (the same sizes from memory, ``--jobs`` processes: what
creating that many files costs on this filesystem, whatever writes them) and
``feedbench sample --workload unet3d`` of about the tree and shards' bytes. Each feedbench run is a
fresh process and its clock stops after ``sync``, so the page cache does not flatter it; the pool
stage (images rendered and encoded once) is timed apart and included in the total. Rates are
bytes written (``st_size`` summed) per second, and each as a fraction of both ``dd`` figures.
``--cwd``: another checkout (an older commit in a worktree) to measure the old code the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in a fresh interpreter: the library called as the CLI calls it, stage times recorded.
# Older code calls progress(n) with one argument and has no pool stage.
IMAGES = """
import json, os, sys, time
from feedbench.sample import SampleSpec, make_sample
t0, marks = time.perf_counter(), {}
def progress(*a):
    if len(a) == 3 and a[0] == "write":
        marks.setdefault("pool_s", time.perf_counter() - t0)
jobs = int(sys.argv[3]) if sys.argv[3] != "0" else None
spec = SampleSpec(images=int(sys.argv[2]), fmt=sys.argv[4])
make_sample(sys.argv[1], spec, jobs=jobs, progress=progress)
os.sync()
marks["total_s"] = time.perf_counter() - t0
print(json.dumps(marks))
"""
WORKLOAD = """
import json, os, sys, time
from feedbench.sample_workload import make_workload
t0 = time.perf_counter()
make_workload(sys.argv[1], "unet3d", float(sys.argv[2]))
os.sync()
print(json.dumps({"total_s": time.perf_counter() - t0}))
"""


def dd(path: Path, mib: int, flag: str) -> float:
    """MB/s of ``dd`` writing ``mib`` MiB of zeros to ``path`` with ``flag``."""
    t0 = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", flag],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - t0
    path.unlink()
    return mib * 2**20 / seconds / 1e6


def tree_bytes(root: Path) -> tuple[int, int]:
    """(bytes, files) under ``root``."""
    total = files = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                else:
                    total, files = total + e.stat().st_size, files + 1
    return total, files


def _plain_part(root: str, sizes: list[int], first: int, step: int) -> None:
    data = os.urandom(max(sizes))
    for i in range(first, len(sizes), step):
        with open(f"{root}/class_{i % 10:03d}/{i:06d}.jpg", "wb") as f:
            f.write(data[: sizes[i]])


def plain_files(root: Path, sizes: list[int], jobs: int) -> dict:
    """The floor for a tree: the same number of files of the same sizes written from memory by
    ``jobs`` processes (open, write, close; nothing generated), then ``sync``."""
    for c in range(10):
        (root / f"class_{c:03d}").mkdir(parents=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs) as ex:
        list(ex.map(_plain_part, [str(root)] * jobs, [sizes] * jobs, range(jobs), [jobs] * jobs))
    os.sync()
    return {"total_s": time.perf_counter() - t0}


def run(code: str, argv: list[str], cwd: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    p = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=cwd, env=env, capture_output=True, text=True
    )
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace) -> dict:
    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    os.sync()
    jobs = args.jobs or os.cpu_count() or 1
    result: dict = {"images": args.images, "jobs": jobs, "cwd": str(args.cwd)}
    result["dd_direct_mb_per_s"] = dd(work / "dd.bin", args.dd_mib, "oflag=direct")
    result["dd_fdatasync_mb_per_s"] = dd(work / "dd.bin", args.dd_mib, "conv=fdatasync")
    runs = {}
    for fmt in ("both", "shards"):
        argv = [str(work / fmt), str(args.images), str(args.jobs), fmt]
        runs[f"images_{fmt}"] = run(IMAGES, argv, args.cwd)
        runs[f"images_{fmt}"]["bytes"], runs[f"images_{fmt}"]["files"] = tree_bytes(work / fmt)
        if fmt == "both":  # the tree's file sizes, for the plain writer
            sizes = [p.stat().st_size for p in sorted((work / fmt).glob("images/*/*.jpg"))]
        shutil.rmtree(work / fmt)
    runs["plain_tree_files"] = plain_files(work / "plain", sizes, jobs)
    runs["plain_tree_files"]["bytes"], runs["plain_tree_files"]["files"] = sum(sizes), len(sizes)
    shutil.rmtree(work / "plain")
    size_gb = runs["images_both"]["bytes"] / 1e9
    runs["unet3d"] = run(WORKLOAD, [str(work / "u3d"), f"{size_gb:.3f}"], args.cwd)
    runs["unet3d"]["bytes"], runs["unet3d"]["files"] = tree_bytes(work / "u3d")
    shutil.rmtree(work / "u3d")
    for r in runs.values():
        r["mb_per_s"] = r["bytes"] / r["total_s"] / 1e6
        for ref in ("direct", "fdatasync"):
            r[f"of_dd_{ref}"] = r["mb_per_s"] / result[f"dd_{ref}_mb_per_s"]
        if "pool_s" in r:
            r["write_mb_per_s"] = r["bytes"] / (r["total_s"] - r["pool_s"]) / 1e6
    result["runs"] = runs
    return result


def render(r: dict) -> str:
    lines = [
        f"dd oflag=direct {r['dd_direct_mb_per_s']:.0f} MB/s, "
        f"dd conv=fdatasync {r['dd_fdatasync_mb_per_s']:.0f} MB/s",
        "| run | bytes | files | seconds | MB/s | × dd direct | × dd fdatasync |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {
        "images_both": "feedbench sample (tree + shards)",
        "images_shards": "feedbench sample --format shards",
        "plain_tree_files": "plain writer, the tree's files (floor)",
        "unet3d": "feedbench sample --workload unet3d",
    }
    for key, name in names.items():
        x = r["runs"][key]
        pool = (
            f" (pool {x['pool_s']:.1f} s; after it {x['write_mb_per_s']:.0f} MB/s)"
            if ("pool_s" in x)
            else ""
        )
        lines.append(
            f"| {name} | {x['bytes'] / 1e6:,.0f} MB | {x['files']:,} | {x['total_s']:.1f}{pool} "
            f"| {x['mb_per_s']:.0f} | {x['of_dd_direct']:.2f} | {x['of_dd_fdatasync']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/feedbench-bench-sample"))
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--jobs", type=int, default=0, help="0: feedbench's default (all cores)")
    p.add_argument("--dd-mib", type=int, default=1024, help="MiB each dd writes")
    p.add_argument("--cwd", type=Path, default=ROOT, help="the checkout to run from")
    p.add_argument("--out", type=Path, help="results JSON")
    args = p.parse_args()
    result = measure(args)
    result["command"] = " ".join(sys.argv)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
