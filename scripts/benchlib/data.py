"""The data under test: generating it, feedbench's per-rank file order, page-cache state, links."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import READ_CHUNK, log


def make_data(n: int, workdir: Path, cores: int) -> Path:
    """``feedbench sample`` with ``n`` images (both layouts) in WORKDIR/data-N, reused if there."""
    out = workdir / f"data-{n}"
    manifest = out / "feedbench-sample.json"
    if manifest.exists():
        spec = json.loads(manifest.read_text()).get("spec", {})
        if spec.get("images") == n and spec.get("fmt") == "both":
            log(f"reusing {out}")
            return out
        raise SystemExit(f"{out} exists and holds another sample: remove it or use --data")
    log(f"generating {n} images into {out} ({cores} jobs)…")
    cmd = [sys.executable, "-m", "feedbench.cli", "sample", str(out), "--images", str(n)]
    subprocess.run([*cmd, "--jobs", str(cores)], check=True, stdout=subprocess.DEVNULL)
    return out


def open_layout(path: Path, fmt: str):
    from feedbench.scan.sources import detect

    source, _ = detect(str(path), fmt)
    return source


def rank_files(source, rank: int, world: int) -> list[str]:
    """The files (tree) or shards feedbench's consumer ``rank`` of ``world`` reads, in its order.

    ``feedbench scan --passes cold`` with one repeat is epoch 0 with seed 0.
    """
    from feedbench.scan.consumer import consumer_units

    files = source.files()
    return [str(files[i]) for i in consumer_units(source, rank, world, seed=0, epoch=0)]


def evict(files: list[str], drop_caches: bool) -> float:
    """Drop ``files`` from the page cache; return the fraction still resident."""
    from feedbench.scan import cache

    cache.evict(files)
    if drop_caches:
        cache.drop_all_caches()
    return cache.residency(files).fraction


def warm(files: list[str]) -> float:
    """Read ``files`` once into the page cache; return the fraction resident afterwards."""
    from feedbench.scan import cache

    for p in files:
        with open(p, "rb") as f:
            while f.read(READ_CHUNK):
                pass
    return cache.residency(files).fraction


def fingerprint(files: list[str]) -> tuple[int, int]:
    """(total bytes, newest mtime): the data must be the same after every tool has read it."""
    sts = [os.stat(p) for p in files]
    return sum(s.st_size for s in sts), max(s.st_mtime_ns for s in sts)


class LinkDirs:
    """One directory of hard links per fio job, holding exactly the files of feedbench's rank k.

    fio's ``--opendir`` skips symlinks (it lstat()s), ``--filename`` lists stop at 4096
    characters and job files at 8192 per line, so hard links (same inode, same page cache) are
    the way to give fio job k an arbitrary file list. They are made next to the work dir, or
    beside the data when the work dir is on another filesystem, and removed afterwards.
    """

    def __init__(self, workdir: Path, data_root: Path) -> None:
        self.candidates = [workdir, data_root]
        self.base: Path | None = None

    def make(self, groups: list[list[str]]) -> list[Path]:
        last: OSError | None = None
        for parent in self.candidates:
            base = Path(tempfile.mkdtemp(prefix=".bench-scan-links-", dir=parent))
            try:
                dirs = [self._link(base / f"job{k:03d}", files) for k, files in enumerate(groups)]
                self.base = base
                return dirs
            except OSError as e:
                last = e
                shutil.rmtree(base, ignore_errors=True)
        raise OSError(f"cannot hard-link the data for fio jobs: {last}")

    @staticmethod
    def _link(d: Path, files: list[str]) -> Path:
        d.mkdir()
        for j, src in enumerate(files):
            os.link(src, d / f"{j:06d}{os.path.splitext(src)[1]}")
        return d

    def remove(self) -> None:
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
