"""Deterministic, realistic sample datasets: ImageNet-like JPEGs, as a class tree and as tar shards.

No downloads. Every image is made from ``numpy.random.default_rng([seed, index])`` alone, so the
same seed gives byte-identical files whatever the number of jobs. Content is photographic-like: a
lit background gradient, 1/f ("pink") texture, a few textured objects with hard edges, and sensor
grain, which makes JPEG sizes behave like photographs (≈ 100 KB at quality 90 for ≈ 500×375 pixels).

Each class has its own colour tint (hue = class / classes), so a test can check that a label still
belongs to its pixels after decoding and cropping: see :func:`class_rgb` and :func:`nearest_class`.
"""

from __future__ import annotations

import colorsys
import io
import json
import math
import os
import tarfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from feedbench.core.errors import FeedbenchError
from feedbench.version import __version__
from loaders.data.layout import SAMPLE_SHARDS, SAMPLE_TREE

FORMATS = ("tree", "shards", "both")
OLD_FORMATS = {"jpeg": "tree", "wds": "shards"}  # the names before 0.2, still read
MANIFEST = "feedbench-sample.json"
TREE_DIR, SHARD_DIR = SAMPLE_TREE, SAMPLE_SHARDS  # what a scan of the sample root finds


@dataclass(frozen=True)
class SampleSpec:
    images: int
    seed: int = 0
    classes: int = 10
    quality: int = 90
    per_shard: int | None = None  # None: ceil(images / 16), clamped to 1..1000
    fmt: str = "both"

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


def encode_jpeg(pixels: np.ndarray, quality: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=quality, subsampling="4:2:0")
    return buf.getvalue()


def label_of(seed: int, index: int, classes: int) -> int:
    """Labels cycle through the classes in a seeded order so every class is used evenly."""
    return int((index + seed) % classes)


def _make_one(args: tuple[int, int, int, int]) -> tuple[int, int, bytes, int, int]:
    seed, index, classes, quality = args
    label = label_of(seed, index, classes)
    pixels = render_image(seed, index, label, classes)
    return index, label, encode_jpeg(pixels, quality), pixels.shape[1], pixels.shape[0]


def _generate(spec: SampleSpec, jobs: int) -> Iterator[tuple[int, int, bytes, int, int]]:
    work = [(spec.seed, i, spec.classes, spec.quality) for i in range(spec.images)]
    if jobs <= 1 or spec.images < 8:
        yield from map(_make_one, work)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(_make_one, work, chunksize=8)


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def make_sample(
    out: str | os.PathLike[str],
    spec: SampleSpec,
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> SampleSummary:
    """Write the dataset under ``out`` (``images/<class>/<key>.jpg`` and/or ``shards/*.tar``)."""
    spec = check(spec, jobs)
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise FeedbenchError(f"{root} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()):
        raise FeedbenchError(f"{root} is not empty: choose a new or empty directory")
    try:
        return _write(root, spec, jobs, progress)
    except OSError as e:
        where = e.filename or root
        raise FeedbenchError(f"cannot write the sample to {where}: {e.strerror or e}") from None


def check(spec: SampleSpec, jobs: int | None) -> SampleSpec:
    """``spec`` checked (one line per problem), its format by today's name."""
    fmt = OLD_FORMATS.get(spec.fmt, spec.fmt)
    if fmt not in FORMATS:
        raise FeedbenchError(f"unknown format {spec.fmt!r}: choose one of {', '.join(FORMATS)}")
    for flag, value, low in (("--images", spec.images, 1), ("--classes", spec.classes, 1),
                             ("--per-shard", spec.per_shard, 1), ("--jobs", jobs, 1)):  # fmt: skip
        if value is not None and value < low:
            raise FeedbenchError(f"{flag} must be at least {low} (got {value})")
    if not 1 <= spec.quality <= 100:
        raise FeedbenchError("--quality must be within 1..100")
    if spec.images < spec.classes:
        raise FeedbenchError(
            f"--images {spec.images} cannot fill --classes {spec.classes}: every class folder "
            "needs an image (an empty one is no ImageFolder)"
        )
    return SampleSpec(spec.images, spec.seed, spec.classes, spec.quality, spec.per_shard, fmt)


def _write(
    root: Path, spec: SampleSpec, jobs: int | None, progress: Callable[[int], None] | None
) -> SampleSummary:
    want_tree = spec.fmt in ("tree", "both")
    want_wds = spec.fmt in ("shards", "both")
    tree = root / TREE_DIR
    shards = root / SHARD_DIR
    if want_tree:
        for c in range(spec.classes):
            (tree / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    if want_wds:
        shards.mkdir(parents=True, exist_ok=True)
    per_shard = spec.shard_size()
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)

    total = 0
    sides: list[int] = []
    tar: tarfile.TarFile | None = None
    n_shards = 0
    try:
        for index, label, data, w, h in _generate(spec, jobs):
            key = f"{index:06d}"
            total += len(data)
            sides += [w, h]
            if want_tree:
                (tree / f"class_{label:03d}" / f"{key}.jpg").write_bytes(data)
            if want_wds:
                if index % per_shard == 0:
                    if tar is not None:
                        tar.close()
                    path = shards / f"shard-{index // per_shard:05d}.tar"
                    tar = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
                    n_shards += 1
                assert tar is not None
                tar.addfile(_tarinfo(f"{key}.jpg", len(data)), io.BytesIO(data))
                cls = str(label).encode()
                tar.addfile(_tarinfo(f"{key}.cls", len(cls)), io.BytesIO(cls))
            if progress is not None:
                progress(1)
    finally:
        if tar is not None:
            tar.close()

    summary = SampleSummary(
        out=str(root),
        images=spec.images,
        classes=spec.classes,
        seed=spec.seed,
        fmt=spec.fmt,
        tree_dir=str(tree) if want_tree else None,
        shard_dir=str(shards) if want_wds else None,
        shards=n_shards,
        jpeg_bytes=total,
        mean_jpeg_bytes=total / spec.images,
        min_side_px=min(sides),
        max_side_px=max(sides),
    )
    manifest = {"made_by": f"feedbench {__version__}", "spec": asdict(spec)}
    manifest["summary"] = {k: v for k, v in asdict(summary).items() if k not in ("out",)}
    manifest["summary"]["tree_dir"] = TREE_DIR if want_tree else None
    manifest["summary"]["shard_dir"] = SHARD_DIR if want_wds else None
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return summary
