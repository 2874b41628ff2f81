"""Datasets shaped like an MLPerf Storage workload (:mod:`feedbench.core.workloads`): its
format, samples per file and sample sizes with their spread, filling a size in GB.

Deterministic: sample sizes come from ``numpy.random.default_rng([seed, SIZES])``, payload bytes
from :func:`payload`, so a seed gives byte-identical files. Sizes are drawn from a lognormal with
the workload's mean and standard deviation (positive, and skewed as real file sizes are:
resnet50's spread exceeds its mean). Payloads are random bytes that no storage layer can compress
or deduplicate, made at memory speed (:func:`payload`). Too small a ``size_gb`` for
:data:`MIN_SAMPLES` samples of the real mean scales every sample down (the scale is recorded), so
tests can write the same shape in a few MB.

Written under ``OUT/data/``: ``unet3d`` as one ``.npz`` per sample (arrays ``x``, the payload
as uint8, and ``y``, a label), ``resnet50`` and ``cosmoflow`` as ``.tfrecord`` files of framed
records (:mod:`loaders.data.tfrecord`); ``OUT/feedbench-sample.json`` records what was made.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np

from feedbench.core.errors import FeedbenchError
from feedbench.core.files import naming
from feedbench.core.workloads import MIN_SAMPLES, Shape, get_shape
from feedbench.version import __version__
from loaders.data import tfrecord

POOL_BYTES = 64 << 20  # random bytes generated once per process
POOL_KEY = 0x7A11  # the pool stream's key, apart from every sample index's
STAMP_EVERY = 2048  # any 4 KiB window holds one whole stamp
MIN_FILES = 4  # small datasets still spread over this many files, so ranks share files
SIZES = 0x5A3E  # the size stream's key, apart from every sample index's
DATA_DIR = "data"
MANIFEST = "feedbench-sample.json"
EXTENSIONS = {"npz": ".npz", "tfrecord": ".tfrecord"}


@dataclass
class WorkloadSummary:
    out: str
    workload: str
    fmt: str
    seed: int
    files: int
    samples: int
    samples_per_file: int
    bytes: int  # sample payload bytes (files hold a little framing more)
    mean_sample_bytes: float
    std_sample_bytes: float
    scale: float  # sample sizes relative to the workload's (1.0: its real sizes)


def sample_sizes(shape: Shape, size_gb: float, seed: int) -> tuple[np.ndarray, float]:
    """Every sample's size in bytes, and the scale applied to fit ``size_gb``."""
    target = size_gb * 1e9
    n = max(MIN_SAMPLES, round(target / shape.sample_bytes))
    scale = min(1.0, target / (n * shape.sample_bytes))
    mean = shape.sample_bytes * scale
    sigma2 = math.log1p((shape.sample_bytes_std / shape.sample_bytes) ** 2)
    rng = np.random.default_rng([seed, SIZES])
    drawn = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)
    return np.maximum(64, np.rint(drawn)).astype(np.int64), scale


@cache
def _random_pool(seed: int) -> np.ndarray:
    return np.frombuffer(np.random.default_rng([seed, POOL_KEY]).bytes(POOL_BYTES), np.uint8)


def payload(seed: int, index: int, nbytes: int) -> np.ndarray:
    """Sample ``index``'s bytes: a window of a seeded random pool, at an offset of its own, with
    a stamp (index, position) every :data:`STAMP_EVERY` bytes, so every 4 KiB of every sample
    holds a stamp no other holds and no block-level deduplication finds two alike; the pool
    repeats only every 64 MiB, beyond what per-record compression (ZFS, btrfs) looks at.
    Generating random bytes per sample (``Generator.bytes``) ran at ~130 MB/s on the dev VM, a
    copy of the pool at memory speed."""
    pool = _random_pool(seed)
    nbytes = int(nbytes)
    start = (index * 0x9E3779B1) % POOL_BYTES
    out = np.empty(nbytes, np.uint8)
    at = 0
    while at < nbytes:  # the pool from ``start``, wrapping round
        take = min(nbytes - at, POOL_BYTES - start)
        out[at : at + take] = pool[start : start + take]
        at, start = at + take, 0
    stamps = out[: nbytes // STAMP_EVERY * STAMP_EVERY].reshape(-1, STAMP_EVERY)
    where = np.arange(len(stamps), dtype=np.uint64)
    stamps[:, :8] = ((np.uint64(index) << np.uint64(24)) | where).view(np.uint8).reshape(-1, 8)
    return out


def _write_npz(path: Path, data: np.ndarray, label: int) -> None:
    """What ``numpy.savez`` writes (stored, uncompressed), but with a fixed member time: savez
    stamps the current time into the zip, so its files differ from run to run. The arrays go
    to the file as they lie in memory (``write_array`` copies them, 16 MiB at a time, first)."""
    arrays = {"x": data, "y": np.asarray(np.int64(label))}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w", force_zip64=True) as f:
                header = np.lib.format.header_data_from_array_1_0(array)
                np.lib.format.write_array_header_1_0(f, header)
                f.write(memoryview(array).cast("B"))


def _write_record(f, data: np.ndarray) -> None:
    """``tfrecord.frame(data)`` written in pieces, the payload without a copy."""
    length = len(data).to_bytes(8, "little")
    f.write(length + tfrecord.masked_crc(length).to_bytes(4, "little"))
    f.write(data)
    f.write(tfrecord.masked_crc(data).to_bytes(4, "little"))


def make_workload(
    out: str | os.PathLike[str],
    workload: str,
    size_gb: float,
    *,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    jobs: int | None = None,
) -> WorkloadSummary:
    """Write ``workload``'s shape filling about ``size_gb`` under ``out`` (new or empty), in
    ``jobs`` processes (default: all cores); ``progress(bytes)`` after each file."""
    shape = get_shape(workload)
    if not size_gb > 0:
        raise FeedbenchError(f"--size must be positive (GB), got {size_gb}")
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FeedbenchError(f"{root} is not a new or empty directory")
    sizes, scale = sample_sizes(shape, size_gb, seed)
    per_file = min(shape.samples_per_file, max(1, math.ceil(len(sizes) / MIN_FILES)))
    if shape.fmt == "npz":
        per_file = 1  # an npz holds one sample (DLIO's unet3d)
    try:
        jobs = jobs or os.cpu_count() or 1
        files = _write(root / DATA_DIR, shape, sizes, per_file, seed, progress, jobs)
        summary = WorkloadSummary(
            str(root), shape.name, shape.fmt, seed, files, len(sizes), per_file,
            int(sizes.sum()), float(sizes.mean()), float(sizes.std()), scale,
        )  # fmt: skip
        _manifest(root, summary, shape.source)
    except OSError as e:
        raise FeedbenchError(f"cannot write to {e.filename or root}: {e.strerror or e}") from None
    return summary


def _manifest(root: Path, summary: WorkloadSummary, source: str) -> None:
    manifest = {"made_by": f"feedbench {__version__}", "workload": asdict(summary)}
    manifest["workload"]["source"] = source
    del manifest["workload"]["out"]
    with naming(root / MANIFEST):
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _write(
    folder: Path, shape: Shape, sizes: np.ndarray, per_file: int, seed: int, progress, jobs: int
):
    """The data files, ``jobs`` processes writing whole files; returns how many. One process
    wrote ~100 MB/s of unet3d npz on the 2-core VM, a quarter of ``dd conv=fdatasync``: the
    copy of the pool and the page cache's copy, both one core's work."""
    folder.mkdir(parents=True, exist_ok=True)
    n_files = math.ceil(len(sizes) / per_file)
    work = [
        (folder, shape, sizes[k * per_file : (k + 1) * per_file], k * per_file, seed, k, n_files)
        for k in range(n_files)
    ]
    jobs = max(1, min(jobs, n_files))
    if jobs == 1:
        for args in work:
            written = _write_file(*args)
            if progress is not None:
                progress(written)
        return n_files
    with ProcessPoolExecutor(jobs) as ex:
        futures = [ex.submit(_write_file, *args) for args in work]
        try:
            for f in as_completed(futures):
                written = f.result()  # a worker's OSError (a full disk) raises here
                if progress is not None:
                    progress(written)
        except BaseException:
            for f in futures:  # stop at once rather than fail every file in turn
                f.cancel()
            raise
    return n_files


def _write_file(
    folder: Path, shape: Shape, sizes: np.ndarray, first: int, seed: int, k: int, n_files: int
) -> int:
    """File ``k`` of ``n_files``: samples ``first``, ``first + 1``, … of ``sizes``' sizes;
    returns its payload bytes."""
    path = folder / f"{shape.name}-{k:06d}-of-{n_files:06d}{EXTENSIONS[shape.fmt]}"
    with naming(path):
        if shape.fmt == "npz":  # one sample per file
            _write_npz(path, payload(seed, first, sizes[0]), first % 1000)
        else:
            with open(path, "wb") as f:
                for i, size in enumerate(sizes, start=first):
                    _write_record(f, payload(seed, i, size))
    return int(sizes.sum())
