#!/usr/bin/env python3
"""Listing at scale (issue 24): ``loaders.data.layout.locate`` on ImageFolder trees of empty
files (10k, 100k, 1.28M: ImageNet-1k's count, 1000 class folders) and on a folder of 100k empty
``.tar`` shards, beside a plain ``os.scandir`` walk with sizes and one sort over the same folder
in the same run. Empty files suffice: listing reads no byte of a file.

    python scripts/bench_scale.py [--sizes 10k,100k,1.28M] [--shards 100k] [--root /tmp/fbscale]
                                  [--repeat 3] [--out FILE] [--delete]

A tree is built once under ``--root`` and reused (a dot-file marks it complete); ``--delete``
removes each after it is measured. The first listing of each is cold when this process may
write ``/proc/sys/vm/drop_caches`` (root), else every figure is warm. To measure an older
checkout, run this file with ``PYTHONPATH`` set to it: the JSON records which ``loaders`` ran.
The goals checked: each 10x of files at most 12x of the time (growth <= 1.2 per file), within
3x of the plain walk, 1.28M files listed in <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

CLASSES = 1000  # ImageNet-1k's class folders
DONE = ".complete"  # a dot-file: listing leaves it out
DROP = "/proc/sys/vm/drop_caches"


def count(text: str) -> int:
    """``10k``, ``1.28M``, ``16000`` → a number of files."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1].lower(), 1)
    return round(float(text[:-1] if scale > 1 else text) * scale)


def _done(folder: Path, n: int) -> bool:
    marker = folder / DONE
    return marker.exists() and marker.read_text().strip() == str(n)


def build_tree(folder: Path, n: int) -> None:
    """``n`` empty ``.JPEG`` files over 1000 class folders (fewer below 10 files a class)."""
    if _done(folder, n):
        return
    shutil.rmtree(folder, ignore_errors=True)
    classes = min(CLASSES, max(1, n // 10))
    flags = os.O_CREAT | os.O_WRONLY
    for c in range(classes):
        d = f"{folder}/n{c:08d}"
        os.makedirs(d)
        for i in range(c, n, classes):
            os.close(os.open(f"{d}/n{c:08d}_{i}.JPEG", flags, 0o644))
    (folder / DONE).write_text(str(n))


def build_shards(folder: Path, n: int) -> None:
    """``n`` empty ``.tar`` files in one folder (a shard set is listed, not read, here)."""
    if _done(folder, n):
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(n):
        os.close(os.open(f"{folder}/shard-{i:06d}.tar", os.O_CREAT | os.O_WRONLY, 0o644))
    (folder / DONE).write_text(str(n))


def plain_walk(path: str) -> int:
    """The floor: every file under ``path`` with its size, one sort; no rule applied."""
    found: list[tuple[str, int]] = []
    stack = [path]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.name.startswith("."):
                    continue
                if e.is_dir():
                    stack.append(e.path)
                else:
                    found.append((e.path, e.stat().st_size))
    found.sort()
    return len(found)


def drop_caches() -> bool:
    """Drop the page, dentry and inode caches, if this process may: the next listing is cold."""
    try:
        os.sync()
        with open(DROP, "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def measure(path: Path, kind: str, n: int, repeat: int) -> dict:
    from loaders.data.layout import locate

    cold = None
    if drop_caches():
        t0 = time.perf_counter()
        layout = locate(path)
        cold = time.perf_counter() - t0
    layout = locate(path)
    listed = len(layout.files)
    assert listed == n and layout.kind == kind, (listed, layout.kind)
    del layout
    warm, plain = [], []
    for _ in range(repeat):  # interleaved: a busy machine slows both alike
        warm += timed(lambda: locate(path), 1)
        plain += timed(lambda: plain_walk(str(path)), 1)
    return {
        "kind": kind, "files": n, "locate_cold_s": cold, "locate_s": warm,
        "scandir_s": plain, "ratio": min(warm) / min(plain),
    }  # fmt: skip


def check(rows: list[dict]) -> list[str]:
    """The goals, one line each, for the rows of one kind in order of size."""
    lines = []
    for a, b in zip(rows, rows[1:], strict=False):
        growth = (min(b["locate_s"]) / min(a["locate_s"])) / (b["files"] / a["files"])
        ok = "ok" if growth <= 1.2 else "MISSED"
        lines.append(
            f"{a['files']:,} -> {b['files']:,}: time per file x{growth:.2f} ({ok}, <= 1.2)"
        )
    for r in rows:
        ok = "ok" if r["ratio"] <= 3 else "MISSED"
        lines.append(f"{r['files']:,} {r['kind']}: {r['ratio']:.2f}x the plain walk ({ok}, <= 3)")
        if r["files"] >= 1_280_000:
            t = min(r["locate_s"])
            lines.append(
                f"{r['files']:,} listed in {t:.1f} s ({'ok' if t <= 30 else 'MISSED'}, <= 30)"
            )
    return lines


def table(rows: list[dict]) -> str:
    head = "| kind | files | locate cold | locate warm (best) | scandir+sort (best) | ratio |"
    out = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        cold = f"{r['locate_cold_s']:.2f} s" if r["locate_cold_s"] is not None else "-"
        out.append(
            f"| {r['kind']} | {r['files']:,} | {cold} | {min(r['locate_s']):.3f} s | "
            f"{min(r['scandir_s']):.3f} s | {r['ratio']:.2f} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10k,100k", help="tree sizes, e.g. 10k,100k,1.28M")
    p.add_argument("--shards", default="100k", help="shard-set size (0: none)")
    p.add_argument("--root", default="/tmp/fbscale", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--delete", action="store_true", help="remove each tree once measured")
    p.add_argument("--out", type=Path, default=Path("results/bench_scale.json"))
    a = p.parse_args()
    import loaders

    jobs = [("tree", count(s)) for s in a.sizes.split(",") if s]
    jobs += [("shards", count(a.shards))] if count(a.shards) else []
    rows = []
    for kind, n in jobs:
        folder = a.root / f"{kind}-{n}"
        t0 = time.perf_counter()
        (build_tree if kind == "tree" else build_shards)(folder, n)
        print(f"{kind} {n:,}: ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        rows.append(measure(folder, kind, n, a.repeat))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
        if a.delete:
            shutil.rmtree(folder)
    trees = [r for r in rows if r["kind"] == "tree"]
    goals = check(trees) + check([r for r in rows if r["kind"] == "shards"])
    print(table(rows))
    print("\n".join(goals))
    where = str(Path(loaders.__file__).parent)
    git = ["git", "-C", where, "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "command": " ".join(sys.argv), "loaders": loaders.__file__, "commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d"), "cold": rows[0]["locate_cold_s"] is not None,
        "rows": rows, "goals": goals,
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
