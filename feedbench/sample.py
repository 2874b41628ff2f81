"""Deterministic, realistic sample datasets: ImageNet-like JPEGs, as a class tree and as tar shards.

No downloads. A pool of images (one per 1,024 written, up to :data:`POOL`, and one per class at
least) is rendered and encoded once; each written image is a copy of a pool image of its class with
its own random half of the coefficient bits flipped (:mod:`feedbench.sample_jpeg`): the same length
and decode work, different bytes every few bytes, so no storage can deduplicate or compress the
dataset, and writing runs at disk speed. Pool image ``j`` is made from ``default_rng([seed, j])``,
the choice of pool image from one seeded stream, image ``i``'s flips from ``default_rng([seed,
i])``: the same seed gives byte-identical files whatever the number of jobs or parts.

Content is photographic-like: a lit background gradient, 1/f ("pink") texture, a few textured
objects with hard edges, and sensor grain, which makes JPEG sizes behave like photographs (≈ 100 KB
at quality 90 for ≈ 500×375 pixels).

Each class has its own colour tint (hue = class / classes), so a test can check that a label still
belongs to its pixels after decoding and cropping: see :func:`class_rgb` and :func:`nearest_class`.
"""

from __future__ import annotations

import colorsys
import json
import math
import multiprocessing
import os
import tarfile
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import numpy as np

from feedbench.core.errors import FeedbenchError
from feedbench.core.files import naming
from feedbench.sample_jpeg import PoolJpeg, encode
from feedbench.version import __version__
from loaders.data.layout import SAMPLE_SHARDS, SAMPLE_TREE

FORMATS = ("tree", "shards", "both")
OLD_FORMATS = {"jpeg": "tree", "wds": "shards"}  # the names before 0.2, still read
MANIFEST = "feedbench-sample.json"
TREE_DIR, SHARD_DIR = SAMPLE_TREE, SAMPLE_SHARDS  # what a scan of the sample root finds
POOL = 256  # at most this many images rendered and encoded by default
POOL_SHARE = 1024  # images written per pool image, below POOL: the pool is a fixed cost
_TAR_TEMPLATE = tarfile.TarInfo("x").tobuf(tarfile.USTAR_FORMAT)  # name, size, chksum per member
PICKS = 0x9E1C  # the pool-choice stream's key, apart from every image index's


@dataclass(frozen=True)
class SampleSpec:
    images: int
    seed: int = 0
    classes: int = 10
    quality: int = 90
    per_shard: int | None = None  # None: ceil(images / 16), clamped to 1..1000
    fmt: str = "both"
    pool: int | None = None  # None: one per POOL_SHARE images, up to POOL

    def shard_size(self) -> int:
        if self.per_shard is not None:
            return self.per_shard
        return max(1, min(1000, math.ceil(self.images / 16)))


@dataclass
class SampleSummary:
    out: str
    images: int
    classes: int
    seed: int
    fmt: str
    tree_dir: str | None
    shard_dir: str | None
    shards: int
    jpeg_bytes: int
    mean_jpeg_bytes: float
    min_side_px: int
    max_side_px: int


def class_rgb(label: int, classes: int) -> np.ndarray:
    """The mean colour (0..255 float, RGB) that images of class ``label`` are tinted towards."""
    r, g, b = colorsys.hsv_to_rgb((label % classes) / classes, 0.55, 0.62)
    return np.array([r, g, b]) * 255.0


def nearest_class(mean_rgb: np.ndarray, classes: int) -> int:
    """The class whose tint is nearest in hue to a mean colour (for label-integrity checks)."""
    r, g, b = (float(x) / 255.0 for x in mean_rgb)
    hue = colorsys.rgb_to_hsv(r, g, b)[0]
    dist = [min(abs(hue - c / classes), 1 - abs(hue - c / classes)) for c in range(classes)]
    return int(np.argmin(dist))


def _size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height), sides in 300..600 px, mostly landscape as in ImageNet."""
    long_side = int(rng.integers(400, 601))
    aspect = float(rng.choice([4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9], p=[0.45, 0.2, 0.15, 0.1, 0.1]))
    short_side = max(300, int(round(long_side / aspect)))
    if rng.random() < 0.72:
        return long_side, short_side
    return short_side, long_side


def _pink(rng: np.random.Generator, h: int, w: int, beta: float) -> np.ndarray:
    """Zero-mean unit-variance noise with a 1/f^beta amplitude spectrum (natural-image-like)."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spec = (
        rng.standard_normal((h, w // 2 + 1)) + 1j * rng.standard_normal((h, w // 2 + 1))
    ) / f**beta
    spec[0, 0] = 0.0
    out = np.fft.irfft2(spec, s=(h, w))
    return out / (out.std() + 1e-9)


def render_image(seed: int, index: int, label: int, classes: int) -> np.ndarray:
    """One photographic-like RGB image (H×W×3 uint8) for sample ``index``."""
    rng = np.random.default_rng([seed, index])
    w, h = _size(rng)
    tint = class_rgb(label, classes)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    # lighting: a smooth gradient in a random direction
    angle = rng.uniform(0, 2 * math.pi)
    light = (np.cos(angle) * (xx / w - 0.5) + np.sin(angle) * (yy / h - 0.5)) * rng.uniform(
        0.2, 0.5
    )
    lum = 1.0 + light
    # texture: luminance 1/f noise plus slightly decorrelated colour noise
    tex = _pink(rng, h, w, beta=1.0) * 0.22
    img = tint[None, None, :] * (lum + tex)[:, :, None]
    for ch in range(3):
        img[:, :, ch] += _pink(rng, h, w, beta=1.3) * 16.0
    # objects: ellipses and rectangles with their own brightness and texture
    for _ in range(int(rng.integers(2, 7))):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.05, 0.3) * w, rng.uniform(0.05, 0.3) * h
        if rng.random() < 0.5:
            mask = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 <= 1.0
        else:
            mask = (np.abs(xx - cx) <= rx) & (np.abs(yy - cy) <= ry)
        shade = rng.uniform(0.55, 1.45)
        stripes = np.sin(xx * rng.uniform(-0.3, 0.3) + yy * rng.uniform(-0.3, 0.3)) * 10.0
        img[mask] = img[mask] * shade + stripes[mask][:, None]
    # sensor grain: the high-frequency detail that JPEG has to spend bits on
    img += rng.normal(0.0, 8.5, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def label_of(seed: int, index: int, classes: int) -> int:
    """Labels cycle through the classes in a seeded order so every class is used evenly."""
    return int((index + seed) % classes)


def pool_size(spec: SampleSpec) -> int:
    """Images rendered and encoded: ``spec.pool``, else one per :data:`POOL_SHARE` images up to
    :data:`POOL`; one per class at least, one per image at most."""
    want = spec.pool or min(POOL, math.ceil(spec.images / POOL_SHARE))
    return max(spec.classes, min(spec.images, want))


def _pool_entry(args: tuple[int, int, int, int]) -> PoolJpeg:
    seed, j, classes, quality = args
    return encode(render_image(seed, j, label_of(seed, j, classes), classes), quality)


def pool_picks(spec: SampleSpec) -> np.ndarray:
    """Which pool image each sample is a copy of: one of its own class (pool image ``j`` has
    class ``label_of(j)``), drawn from one seeded stream so every part of a run agrees."""
    n_pool = pool_size(spec)
    index = np.arange(spec.images, dtype=np.int64)
    if n_pool >= spec.images:
        return index
    first = index % spec.classes  # the lowest pool index of each sample's class
    count = (n_pool - first + spec.classes - 1) // spec.classes
    draw = np.random.default_rng([spec.seed, PICKS]).random(spec.images)
    return first + spec.classes * (draw * count).astype(np.int64)


def _tar_header(name: str, size: int) -> bytes:
    """The USTAR header ``tarfile`` writes for a plain file (mode 644, owner 0, time 0), made
    from a template: ``TarInfo.tobuf`` costs ~0.2 ms, a fifth of writing an image."""
    header = bytearray(_TAR_TEMPLATE)
    header[0:100] = name.encode().ljust(100, b"\0")
    header[124:136] = b"%011o\0" % size
    header[148:156] = b"        "
    header[148:155] = b"%06o\0" % sum(header)
    return bytes(header)


def _tar_member(name: str, data: bytes) -> bytes:
    """One member as ``tarfile`` writes it: header, data, zero padding to 512 bytes."""
    return _tar_header(name, len(data)) + data + bytes(-len(data) % tarfile.BLOCKSIZE)


def _tar_end(written: int) -> bytes:
    """What ``TarFile.close`` appends: two zero blocks, then zeros to a whole record."""
    end = written + 2 * tarfile.BLOCKSIZE
    return bytes(2 * tarfile.BLOCKSIZE + (-end % tarfile.RECORDSIZE))


Progress = Callable[[str, int, int], None]  # (stage, done, total): "pool" then "write"


def make_sample(
    out: str | os.PathLike[str],
    spec: SampleSpec,
    *,
    jobs: int | None = None,
    part: tuple[int, int] = (0, 1),
    progress: Progress | None = None,
) -> SampleSummary:
    """Write the dataset under ``out`` (``images/<class>/<key>.jpg`` and/or ``shards/*.tar``).

    ``part=(k, m)``: write only the k-th of m contiguous runs of shards (and their tree files),
    so m hosts writing parts 0..m-1 into one folder, or folders merged later, give the same
    files and bytes as one run; part 0 writes the manifest."""
    spec = check(spec, jobs)
    k, m = part
    if not 0 <= k < m:
        raise FeedbenchError(f"--part {k}/{m}: K must be within 0..M-1")
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise FeedbenchError(f"{root} exists and is not a directory")
    ours = {TREE_DIR, SHARD_DIR, MANIFEST} if m > 1 else set()  # parts share one folder
    if root.is_dir() and any(p.name not in ours for p in root.iterdir()):
        raise FeedbenchError(f"{root} is not empty: choose a new or empty directory")
    try:
        return _write(root, spec, jobs or os.cpu_count() or 1, part, progress)
    except OSError as e:
        where = e.filename or root
        raise FeedbenchError(f"cannot write the sample to {where}: {e.strerror or e}") from None


def check(spec: SampleSpec, jobs: int | None) -> SampleSpec:
    """``spec`` checked (one line per problem), its format by today's name."""
    fmt = OLD_FORMATS.get(spec.fmt, spec.fmt)
    if fmt not in FORMATS:
        raise FeedbenchError(f"unknown format {spec.fmt!r}: choose one of {', '.join(FORMATS)}")
    for flag, value, low in (("--images", spec.images, 1), ("--classes", spec.classes, 1),
                             ("--per-shard", spec.per_shard, 1), ("--jobs", jobs, 1),
                             ("--pool", spec.pool, 1)):  # fmt: skip
        if value is not None and value < low:
            raise FeedbenchError(f"{flag} must be at least {low} (got {value})")
    if not 1 <= spec.quality <= 100:
        raise FeedbenchError("--quality must be within 1..100")
    if spec.images < spec.classes:
        raise FeedbenchError(
            f"--images {spec.images} cannot fill --classes {spec.classes}: every class folder "
            "needs an image (an empty one is no ImageFolder)"
        )
    return SampleSpec(
        spec.images, spec.seed, spec.classes, spec.quality, spec.per_shard, fmt, spec.pool
    )


def _build_pool(spec: SampleSpec, jobs: int, progress: Progress | None) -> list[PoolJpeg]:
    work = [(spec.seed, j, spec.classes, spec.quality) for j in range(pool_size(spec))]
    pool: list[PoolJpeg] = []
    with _executor(min(jobs, len(work))) as ex:
        for entry in ex.map(_pool_entry, work) if ex else map(_pool_entry, work):
            pool.append(entry)
            if progress is not None:
                progress("pool", len(pool), len(work))
    return pool


@contextmanager
def _executor(jobs: int, *init) -> Iterator[ProcessPoolExecutor | None]:
    """Worker processes, or None for one job: no processes to start."""
    if jobs <= 1:
        yield None
        return
    with ProcessPoolExecutor(jobs, initializer=_init if init else None, initargs=init) as ex:
        yield ex


_STATE: dict[str, object] = {}  # in each writing process: what every unit needs


def _init(pool: list[PoolJpeg], picks: np.ndarray, done: Synchronized | None) -> None:
    _STATE.update(pool=pool, picks=picks, done=done)


def _write(
    root: Path, spec: SampleSpec, jobs: int, part: tuple[int, int], progress: Progress | None
) -> SampleSummary:
    want_tree = spec.fmt in ("tree", "both")
    want_wds = spec.fmt in ("shards", "both")
    if want_tree:
        for c in range(spec.classes):
            (root / TREE_DIR / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    if want_wds:
        (root / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    pool = _build_pool(spec, jobs, progress)
    picks = pool_picks(spec)
    per_shard = spec.shard_size()
    n_units = math.ceil(spec.images / per_shard)
    k, m = part
    units = range(k * n_units // m, (k + 1) * n_units // m)
    total = sum(min(spec.images, (u + 1) * per_shard) - u * per_shard for u in units)
    jobs = min(jobs, len(units))
    done = multiprocessing.Value("q", 0) if jobs > 1 else None
    with _executor(jobs, pool, picks, done) as ex:
        if ex is None:
            _init(pool, picks, None)
            written = 0
            for u in units:
                written += _write_unit(root, spec, u)
                if progress is not None:
                    progress("write", written, total)
        else:
            futures = [ex.submit(_write_unit, root, spec, u) for u in units]
            _wait(futures, done, total, progress)
    summary = _summary(root, spec, pool, picks, n_units if want_wds else 0)
    if k == 0:
        _manifest(root, spec, summary)
    return summary


def _wait(futures: list, done: Synchronized, total: int, progress: Progress | None) -> None:
    """Until every unit is written, reporting the images written so far; a failure raises."""
    pending = set(futures)
    while pending:
        finished, pending = wait(pending, timeout=0.25, return_when=FIRST_EXCEPTION)
        if any(f.exception() is not None for f in finished):
            for f in pending:  # a full disk: stop at once rather than fail every unit in turn
                f.cancel()
            next(f for f in finished if f.exception() is not None).result()
        if progress is not None:
            progress("write", int(done.value), total)


def _write_unit(root: Path, spec: SampleSpec, unit: int) -> int:
    """Shard ``unit``'s images: into the tree, into ``shards/shard-UNIT.tar``, or both."""
    pool: list[PoolJpeg] = _STATE["pool"]  # type: ignore[assignment]
    picks: np.ndarray = _STATE["picks"]  # type: ignore[assignment]
    done: Synchronized | None = _STATE["done"]  # type: ignore[assignment]
    per_shard = spec.shard_size()
    first, last = unit * per_shard, min(spec.images, (unit + 1) * per_shard)
    tree = str(root / TREE_DIR) if spec.fmt in ("tree", "both") else None
    tar_path = root / SHARD_DIR / f"shard-{unit:05d}.tar"
    shards = spec.fmt in ("shards", "both")
    # a write's error (a full disk) names no file: the one line names the shard or the image
    with naming(tar_path), open(tar_path, "wb") if shards else nullcontext() as tar:
        written = 0
        for index in range(first, last):
            label = label_of(spec.seed, index, spec.classes)
            data = pool[picks[index]].variant(np.random.default_rng([spec.seed, index]))
            if tree is not None:
                path = f"{tree}/class_{label:03d}/{index:06d}.jpg"
                with naming(path), open(path, "wb") as f:
                    f.write(data)
            if tar is not None:
                member = _tar_member(f"{index:06d}.jpg", data)
                member += _tar_member(f"{index:06d}.cls", str(label).encode())
                written += tar.write(member)
            if done is not None:
                with done.get_lock():
                    done.value += 1
        if tar is not None:
            tar.write(_tar_end(written))
    return last - first


def _summary(
    root: Path, spec: SampleSpec, pool: list[PoolJpeg], picks: np.ndarray, shards: int
) -> SampleSummary:
    """The whole dataset's figures, whatever part was written: a copy is as long as its original."""
    sizes = np.array([len(p.data) for p in pool], dtype=np.int64)[picks]
    used = np.unique(picks)
    sides = [s for j in used for s in (pool[j].width, pool[j].height)]
    total = int(sizes.sum())
    return SampleSummary(
        out=str(root),
        images=spec.images,
        classes=spec.classes,
        seed=spec.seed,
        fmt=spec.fmt,
        tree_dir=str(root / TREE_DIR) if spec.fmt in ("tree", "both") else None,
        shard_dir=str(root / SHARD_DIR) if shards else None,
        shards=shards,
        jpeg_bytes=total,
        mean_jpeg_bytes=total / spec.images,
        min_side_px=min(sides),
        max_side_px=max(sides),
    )


def _manifest(root: Path, spec: SampleSpec, summary: SampleSummary) -> None:
    manifest = {"made_by": f"feedbench {__version__}", "spec": asdict(spec)}
    manifest["summary"] = {k: v for k, v in asdict(summary).items() if k not in ("out",)}
    manifest["summary"]["tree_dir"] = TREE_DIR if summary.tree_dir else None
    manifest["summary"]["shard_dir"] = SHARD_DIR if summary.shard_dir else None
    with naming(root / MANIFEST):
        (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
