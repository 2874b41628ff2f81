#!/usr/bin/env python3
"""The sample index at ImageNet scale: listing once per job, the saved index, and its memory.

Builds a tree of ``--files`` files in ``--classes`` class folders under ``--root`` (empty files,
but the first class holds tiny real JPEGs so a loader can decode its first batches: listing and
memory do not depend on file sizes), then measures:

- listing + indexing the tree (``locate`` + ``open_index``), saving the index, its file size and
  in-memory bytes per sample, and loading it (mapped);
- one machine's ranks (torchrun-like processes with RANK/LOCAL_RANK set) each obtaining the
  index as ``build_loader`` does: wall time until every rank holds it, and how many listed, at
  1 and ``--ranks`` ranks;
- the scan's hand-over: a consumer loading the parent's listing and index files;
- memory: PSS/USS/RSS (psutil) of the process holding the loaded index and of one forked
  DataLoader worker after it served two batches, and the PSS both add to what this process
  held before; time to the first batch with the saved index.

    python scripts/bench_index_scale.py [--files 1280000] [--classes 1000] [--ranks 8]
        [--repeat 2] [--root /tmp/fbindex] [--keep] [--out results.json]

The tree is made only where nothing is (or where this script made it before: a marker file) and
removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = ".fbindex-bench"


def make_tree(root: Path, files: int, classes: int) -> float:
    """``files`` files in ``classes`` folders (the first class: tiny JPEGs); seconds taken."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buf, "JPEG")
    jpeg = buf.getvalue()
    t0 = time.perf_counter()
    root.mkdir(parents=True)
    (root / MARKER).write_text("made by scripts/bench_index_scale.py\n")
    per = -(-files // classes)
    for c in range(classes):
        folder = root / f"c{c:04d}"
        folder.mkdir()
        content = jpeg if c == 0 else b""
        for i in range(min(per, files - c * per)):
            fd = os.open(folder / f"{c:04d}_{i:07d}.jpg", os.O_WRONLY | os.O_CREAT, 0o644)
            if content:
                os.write(fd, content)
            os.close(fd)
    return time.perf_counter() - t0


def free_inodes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_favail


def measure_listing(root: Path, out: Path) -> tuple[dict, object]:
    from loaders.data import SampleIndex, locate, open_index
    from loaders.data.index import listed_as

    t0 = time.perf_counter()
    layout = locate(root)
    t1 = time.perf_counter()
    index = open_index(layout)
    index.listed = listed_as(root, "auto")
    t2 = time.perf_counter()
    saved = out / "index.npz"
    index.save(saved)
    t3 = time.perf_counter()
    loaded = SampleIndex.load(saved)
    t4 = time.perf_counter()
    n = len(index)
    return {
        "samples": n,
        "list_s": t1 - t0,
        "index_s": t2 - t1,
        "save_s": t3 - t2,
        "load_s": t4 - t3,
        "file_bytes": saved.stat().st_size,
        "file_bytes_per_sample": saved.stat().st_size / n,
        "nbytes_per_sample": index.nbytes / n,
        "loaded_samples": len(loaded),
    }, layout


def measure_handover(root: Path, out: Path, layout) -> dict:
    """The scan's parent saves its listing (and the loaders' index); a consumer loads both."""
    from loaders.data import SampleIndex
    from loaders.data.index import listed_as
    from loaders.data.saved import load_layout, save_layout

    t0 = time.perf_counter()
    save_layout(layout, out / "layout.npz", listed_as(root, "auto"))
    t1 = time.perf_counter()
    got = load_layout(out / "layout.npz", listed_as(root, "auto"))
    SampleIndex.load(out / "index.npz")
    t2 = time.perf_counter()
    assert len(got.files) == len(layout.files)
    return {"parent_save_layout_s": t1 - t0, "consumer_load_s": t2 - t1}


RANK_CODE = r"""
import json, os, sys, time
from loaders.data import index as index_module
from loaders.dist import DistInfo
from loaders.index_once import obtain
root, out = sys.argv[1], sys.argv[4]
n, rank, t_start = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[5])
listed = []
real = index_module.locate
def counted(*a, **k):
    t = time.time(); r = real(*a, **k); listed.append(time.time() - t); return r
index_module.locate = counted
t0 = time.time()
index = obtain(root, "auto", DistInfo(rank, n, rank, n, "arguments"), None)
done = time.time()
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump({"samples": len(index), "listings": len(listed), "listing_s": sum(listed),
               "ready_s": done - t_start, "obtain_s": done - t0}, f)
while len([p for p in os.listdir(out) if p.startswith("rank")]) < n:
    time.sleep(0.05)  # rank 0 removes the job's index when it exits: not before the others ran
"""


def measure_ranks(root: Path, out: Path, n: int, name: str) -> dict:
    """``n`` rank processes of one machine obtaining the index as build_loader does."""
    folder = out / f"ranks{name}"
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t_start = time.time()
    argv = [str(root), str(n), "RANK", str(folder), repr(t_start)]
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK_CODE, *argv[:2], str(r), *argv[3:]], env=env)
        for r in range(n)
    ]
    for p in procs:
        p.wait()
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]
    return {
        "ranks": n,
        "wall_s_until_every_rank_has_it": max(r["ready_s"] for r in ranks),
        "listings": sum(r["listings"] for r in ranks),
        "total_listing_s": sum(r["listing_s"] for r in ranks),
        "per_rank": ranks,
    }


MEMORY_CODE = r"""
import json, sys, time
import psutil
import torch  # (imported before measuring: a training process has it)
from loaders import build_loader
root, saved = sys.argv[1], sys.argv[2]
me = psutil.Process()
before = me.memory_full_info().pss
t0 = time.perf_counter()
loader = build_loader(root, "torch", 16, workers=1, train=False, device="cpu", index=saved,
                      prefetch=1)
batches = iter(loader)
next(batches)
first_batch_s = time.perf_counter() - t0
next(batches)
(worker,) = [c for c in me.children() if c.is_running()][:1]
mine, theirs = me.memory_full_info(), worker.memory_full_info()
mb = 1 << 20
print(json.dumps({
    "first_batch_s_with_saved_index": first_batch_s,
    "pss_mb_before_loader": before / mb,
    "parent": {"rss_mb": mine.rss / mb, "pss_mb": mine.pss / mb, "uss_mb": mine.uss / mb},
    "worker": {"rss_mb": theirs.rss / mb, "pss_mb": theirs.pss / mb, "uss_mb": theirs.uss / mb},
    # what the loader (index mapped) and its worker added: both PSS after, less this process's
    # before (pages the worker shares with it are counted once)
    "added_pss_mb": (mine.pss + theirs.pss - before) / mb,
}))
"""


def measure_memory(root: Path, out: Path) -> dict:
    """A fresh process (as a rank: torch imported) builds a loader over the saved index, one
    forked worker serves two batches: PSS/USS/RSS of both, and what they added."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-c", MEMORY_CODE, str(root), str(out / "index.npz")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1_280_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2, help="runs of 1 and of --ranks ranks each")
    p.add_argument("--root", type=Path, default=Path("/tmp/fbindex"))
    p.add_argument("--keep", action="store_true", help="leave the tree (to run again)")
    p.add_argument("--out", type=Path, help="results JSON")
    args = p.parse_args()
    root, made_s = args.root, None
    if root.exists() and not (root / MARKER).exists():
        sys.exit(f"{root} exists and was not made by this script: choose another --root")
    if not root.exists():
        need = args.files + args.classes + 1000
        if free_inodes(str(root.parent)) < need:
            sys.exit(f"fewer than {need} free inodes under {root.parent}")
        made_s = make_tree(root, args.files, args.classes)
    work = Path(str(root) + "-work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        result = {"files": args.files, "make_tree_s": made_s}
        result["listing"], layout = measure_listing(root, work)
        result["handover"] = measure_handover(root, work, layout)
        del layout
        runs = []
        for k in range(args.repeat):  # interleaved: a busy neighbour hits both alike
            for n in (1, args.ranks) if k % 2 == 0 else (args.ranks, 1):
                runs.append(measure_ranks(root, work, n, f"{n}-{k}"))
        result["ranks"] = runs
        for key in ("total_listing_s", "wall_s_until_every_rank_has_it"):
            one = statistics.median(r[key] for r in runs if r["ranks"] == 1)
            many = statistics.median(r[key] for r in runs if r["ranks"] == args.ranks)
            result[f"median_{key}"] = {"1": one, str(args.ranks): many, "ratio": many / one}
        result["memory"] = measure_memory(root, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    for run in result["ranks"]:  # each rank's figures: in --out only
        run.pop("per_rank")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
