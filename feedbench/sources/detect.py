"""Format detection: what is at PATH, and which source reads it."""

from __future__ import annotations

import glob
import os
import re

from feedbench.errors import FeedbenchError
from feedbench.sources.base import Source
from feedbench.sources.local import ShardSource, TreeSource

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
FORMATS = ("auto", "tree", "shards")
REMOTE_PREFIXES = ("s3://", "http://", "https://")


def _expand(pattern: str) -> list[str]:
    """Brace lists (``shard-{000..009}.tar``) and globs, as WebDataset users write them."""
    import braceexpand  # ships with webdataset

    out: list[str] = []
    for item in braceexpand.braceexpand(pattern):
        out.extend(sorted(glob.glob(item)) if glob.has_magic(item) else [item])
    return out


def _shards(root: str, paths: list[str]) -> ShardSource:
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FeedbenchError(
            f"shard not found: {missing[0]} ({len(missing)} of {len(paths)} missing)"
        )
    return ShardSource(root, paths, [os.path.getsize(p) for p in paths])


def detect(path: str, fmt: str = "auto") -> tuple[Source, list[str]]:
    """Return the source at ``path`` and notes about the choice (e.g. a second layout ignored)."""
    if fmt not in FORMATS:
        raise FeedbenchError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if path.startswith(REMOTE_PREFIXES):
        from feedbench.sources.remote import detect_remote

        return detect_remote(path, fmt)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path):
        scheme = path.split("://", 1)[0]
        raise FeedbenchError(
            f"unsupported URL scheme {scheme}:// (feedbench reads s3://, http:// and https://; "
            "mount other stores and scan the mount)"
        )
    if "{" in path or glob.has_magic(path):
        paths = _expand(path)
        if not paths:
            raise FeedbenchError(f"no files match {path}")
        if not all(p.endswith(".tar") for p in paths):
            raise FeedbenchError(f"a pattern must name .tar shards: {path}")
        return _shards(os.path.dirname(paths[0]) or ".", paths), []
    if not os.path.exists(path):
        raise FeedbenchError(f"no such file or directory: {path}")
    if os.path.isfile(path):
        if path.endswith(".tar"):
            return _shards(os.path.dirname(path) or ".", [path]), []
        raise FeedbenchError(f"{path} is a file: give a directory of images or .tar shards")
    if not os.access(path, os.R_OK | os.X_OK):
        raise FeedbenchError(f"permission denied: {path}")

    images: list[str] = []
    image_sizes: list[int] = []
    tars: list[str] = []
    others: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            ext = os.path.splitext(name)[1].lower()
            if ext in IMAGE_EXTENSIONS:
                images.append(full)
                try:
                    image_sizes.append(os.path.getsize(full))
                except OSError:
                    image_sizes.append(0)
            elif ext == ".tar":
                tars.append(full)
            else:
                others.append(full)

    if not images and not tars:
        if not others:
            raise FeedbenchError(f"{path} is empty: no files to scan")
        example = os.path.relpath(others[0], path)
        raise FeedbenchError(
            f"no images ({', '.join(IMAGE_EXTENSIONS)}) or .tar shards in {path} "
            f"({len(others)} other files, e.g. {example})"
        )
    use, notes = choose_layout(fmt, f"in {path}", path, len(images), len(tars))
    if use == "tree":
        return TreeSource(path, images, image_sizes), notes
    return _shards(path, sorted(tars)), notes


def choose_layout(fmt: str, where: str, name: str, images: int, tars: int) -> tuple[str, list[str]]:
    """``tree`` or ``shards`` for a place holding ``images`` images and ``tars`` shards (not
    both none), as ``--format`` asks (``auto``: the images when there are any), and the notes to
    show; one clear error when the asked layout is not there. Local paths and URLs alike."""
    notes: list[str] = []
    use = fmt
    if use == "auto":
        use = "tree" if images else "shards"
        if images and tars:
            notes.append(
                f"{name} holds both {images} images and {tars} tar shards: "
                "scanned the images; pass --format shards to scan the shards"
            )
    if use == "tree" and not images:
        raise FeedbenchError(f"--format tree: no images {where} (found {tars} .tar shards)")
    if use == "shards" and not tars:
        raise FeedbenchError(f"--format shards: no .tar shards {where} (found {images} images)")
    return use, notes
