"""What is at a path or URL: an image tree (ImageFolder), WebDataset tar shards, or data files
of a record format (:mod:`loaders.data.records`), listed once.

:func:`locate` accepts a directory (or a URL prefix / folder), one ``.tar``, or a brace list or
glob of shards, and returns a :class:`Layout`. The rules, the same for the loaders and for scan:

* A folder holding images is a tree: the label of an image is its first folder below the tree's
  root (class folders in sorted order). Images lying directly in the root with no class folder
  beside them form one class named after the root; beside class folders they are skipped.
* A feedbench sample root (``images/`` and/or ``shards/`` and nothing else that counts) is read as
  the tree in ``images/`` or the shards in ``shards/``.
* ``fmt="auto"`` takes the images when a place holds both images and shards (and says so in a
  note); ``"tree"`` / ``"shards"`` force one. A place with neither, whose other files are of
  one record format by extension (``.npy``, ``.npz``, ``.tfrecord``, ``.h5``, ``.parquet``), is
  read in that format; a record format named in ``fmt`` takes its files (``files``: every file)
  and leaves the rest. Dot-files and dot-folders are never listed.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from loaders.data import columnar, patterns, records, remote
from loaders.data.formats import IMAGE_EXTENSIONS, is_image, is_shard
from loaders.data.records import RECORD_FORMATS, RecordTable
from loaders.errors import LoaderError

FORMATS = ("auto", "tree", "shards", *RECORD_FORMATS)
SAMPLE_TREE, SAMPLE_SHARDS = "images", "shards"  # a feedbench sample root's two folders


class Skipped(NamedTuple):
    """One sample (or file) left out, and why."""

    path: str
    reason: str


@dataclass
class Layout:
    # "tree", "shards", "records" (data files), or "files" (any files, from locate_files: for a
    # loader that reads them its own way)
    kind: str
    root: str  # the tree's root (labels are its folders), or the shards' folder
    files: list[str]  # images (sorted), shards (in the order given) or data files (sorted)
    sizes: list[int]  # bytes per file (0 where a server would not say)
    remote: bool = False
    labels: np.ndarray | None = None  # tree: class index per file
    classes: list[str] = field(default_factory=list)  # tree: class folder names, sorted
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fmt: str = ""  # records: the record format
    table: RecordTable | None = None  # records: where every sample lies

    @property
    def total_bytes(self) -> int:
        return int(sum(self.sizes))


def locate(path: str | os.PathLike[str], fmt: str = "auto") -> Layout:
    """The layout at ``path`` (see the module docstring), or one clear :class:`LoaderError`."""
    base, option = records.split_format(fmt)
    if base not in FORMATS or not records.check_option(base, option):
        raise LoaderError(
            f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)} (hdf5:NAME names the "
            "HDF5 dataset, parquet:rows=N makes N rows a sample)"
        )
    text = os.fspath(path)
    url = remote.is_url(text)
    if url:
        remote.check_protocol(text)
    if patterns.has_pattern(text):
        return _pattern(text, url, fmt)
    return _place(text, fmt) if url else _folder(text, fmt)


def _shards(root: str, paths: list[str], sizes: list[int], url: bool) -> Layout:
    return Layout("shards", root, paths, sizes, remote=url)


def _sizes(paths: list[str], url: bool) -> dict[str, int]:
    """Each named file's size; a local file that is not there is one clear error."""
    if url:
        return dict(zip(paths, remote.sizes(paths), strict=True))
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise LoaderError(f"file not found: {missing[0]} ({len(missing)} of {len(paths)} missing)")
    return {p: os.path.getsize(p) for p in paths}


def _pattern(pattern: str, url: bool, fmt: str) -> Layout:
    shown = remote.redact_url(pattern)
    paths = patterns.expand(pattern)
    if not paths:
        raise LoaderError(f"no files match {shown}")
    kinds = {records.format_of(_path_part(p)) for p in paths}
    if _is_record(fmt) or (fmt == "auto" and len(kinds) == 1 and None not in kinds):
        found = _sizes(paths, url)
        return _records(_parent(paths[0]), found, fmt if fmt != "auto" else kinds.pop(), url)
    if not all(is_shard(_path_part(p)) for p in paths):
        raise LoaderError(f"a pattern must name .tar shards or data files of one format: {shown}")
    if url:
        return _shards(_parent(paths[0]), paths, remote.sizes(paths), True)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise LoaderError(f"shard not found: {missing[0]} ({len(missing)} of {len(paths)} missing)")
    return _shards(_parent(paths[0]), paths, [os.path.getsize(p) for p in paths], False)


def _path_part(item: str) -> str:
    return item.split("?", 1)[0] if remote.is_url(item) else item


def _parent(path: str) -> str:
    return (path.rsplit("/", 1)[0] if remote.is_url(path) else os.path.dirname(path)) or "."


def _folder(path: str, fmt: str) -> Layout:
    if not os.path.exists(path):
        raise LoaderError(f"no such file or directory: {path}")
    if os.path.isfile(path):
        if _is_record(fmt) or (fmt == "auto" and records.format_of(path)):
            use = fmt if fmt != "auto" else records.format_of(path)
            return _records(_parent(path), {path: os.path.getsize(path)}, use, False)
        if is_shard(path):
            return _shards(_parent(path), [path], [os.path.getsize(path)], False)
        raise LoaderError(
            f"{path} is a file: give a directory of images or .tar shards, or a data file "
            "(.npy, .npz, .tfrecord; --format files for any file)"
        )
    return _classify(path, _walk(path), fmt, url=False)


def _walk(path: str) -> dict[str, int]:
    """Every file under the folder ``path`` (dot-files and dot-folders left out) → its size."""
    if not os.access(path, os.R_OK | os.X_OK):
        raise LoaderError(f"permission denied: {path}")
    found: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                full = os.path.join(dirpath, name)
                try:
                    found[full] = os.path.getsize(full)
                except OSError:
                    found[full] = 0
    return found


def locate_files(path: str | os.PathLike[str]) -> Layout:
    """Every file at a local ``path`` (one file, or all under a folder) as kind ``files``: the
    data of a loader that reads it its own way (Parquet, LMDB, ...), for cache control only."""
    text = os.fspath(path)
    if remote.is_url(text):
        raise LoaderError(f"a local path is needed here, not a URL: {remote.redact_url(text)}")
    if not os.path.exists(text):
        raise LoaderError(f"no such file or directory: {text}")
    found = {text: os.path.getsize(text)} if os.path.isfile(text) else _walk(text)
    if not found:
        raise LoaderError(f"{text} is empty: no files in it")
    root = os.path.dirname(text) if os.path.isfile(text) else text
    return Layout("files", root or ".", list(found), list(found.values()))


def _place(url: str, fmt: str) -> Layout:
    listing = remote.list_objects(url)
    if not listing:  # an object store has no folders: an empty prefix is no prefix
        raise LoaderError(f"no such file or directory, or nothing in it: {remote.redact_url(url)}")
    if len(listing) == 1 and url in listing:
        size = listing[url] or remote.sizes([url])[0]
        kind = records.format_of(_path_part(url))
        if _is_record(fmt) or (fmt == "auto" and kind):
            return _records(_parent(url), {url: size}, fmt if fmt != "auto" else kind, True)
        if is_shard(_path_part(url)):
            return _shards(_parent(url), [url], [size], True)
    layout = _classify(url.rstrip("/"), listing, fmt, url=True)
    if not any(layout.sizes):  # index pages carry no sizes: ask the server (HEAD)
        layout.sizes = remote.sizes(layout.files)
    return layout


def _rel(root: str, full: str, url: bool) -> str:
    return full[len(root) :].lstrip("/") if url else os.path.relpath(full, root)


def _classify(root: str, found: dict[str, int], fmt: str, *, url: bool) -> Layout:
    """Images, shards and other files found under ``root`` → the layout ``fmt`` asks for."""
    shown = remote.redact_url(root)
    sep = "/" if url else os.sep
    if not found:
        raise LoaderError(f"{shown} is empty: no files in it")
    if _is_record(fmt):
        return _records(root, found, fmt, url)
    rels = {full: _rel(root, full, url) for full in found}
    images = sorted(f for f, r in rels.items() if is_image(r))
    tars = sorted(f for f, r in rels.items() if is_shard(_path_part(r)))
    others = sorted(f for f in found if f not in set(images) | set(tars))
    if not images and not tars:
        kinds = {records.format_of(_path_part(rels[f])) for f in others} - {None}
        if fmt == "auto" and len(kinds) == 1:
            return _records(root, found, kinds.pop(), url)
        raise LoaderError(
            f"no images ({', '.join(IMAGE_EXTENSIONS)}) or .tar shards in {shown} "
            f"({len(others)} other files, e.g. {rels[others[0]]}); data files are read when "
            "all are of one format (.npy, .npz, .tfrecord, .h5, .parquet), any file with "
            "--format files"
        )
    sample_root = all(rels[f].startswith(SAMPLE_TREE + sep) for f in images) and all(
        rels[f].startswith(SAMPLE_SHARDS + sep) for f in tars
    )
    use, notes = choose(fmt, f"in {shown}", shown, len(images), len(tars))
    if use == "shards":
        folder = (root + sep + SAMPLE_SHARDS) if sample_root and tars else root
        return Layout("shards", folder, tars, [found[t] for t in tars], url, notes=notes)
    tree_root = (root + sep + SAMPLE_TREE) if sample_root else root
    layout = _tree(tree_root, images, found, url)
    layout.notes = notes
    layout.skipped += [
        Skipped(f, "not an image file (extension)") for f in others if _under(f, tree_root, sep)
    ]
    return layout


def _is_record(fmt: str) -> bool:
    return records.split_format(fmt)[0] in RECORD_FORMATS


def _records(root: str, found: dict[str, int], fmt: str, url: bool) -> Layout:
    """The files of record format ``fmt`` among ``found`` (``files``: all), their samples
    indexed (:func:`loaders.data.records.build_table`); other files are left out, counted."""
    shown = remote.redact_url(root)
    fmt, option = records.split_format(fmt)
    exts = records.EXTENSIONS.get(fmt)
    files = sorted(f for f in found if exts is None or _path_part(f).lower().endswith(exts))
    if not files:
        raise LoaderError(
            f"format {fmt!r}: no {'/'.join(exts or ())} files in {shown} "
            f"(found {len(found)} other files)"
        )
    sizes = [found[f] for f in files]
    if url and not any(sizes):  # index pages carry no sizes: ask the server (HEAD)
        sizes = remote.sizes(files)
    table, left_out = records.build_table(fmt, files, sizes, url, option)
    skipped = [Skipped(f, f"not a {fmt} file (extension)") for f in found if f not in set(files)]
    skipped += [Skipped(f, why) for f, why in left_out]
    if not len(table):
        reason = f" ({skipped[-1].path}: {skipped[-1].reason})" if skipped else ""
        raise LoaderError(f"format {fmt!r}: no samples in {len(files)} files in {shown}{reason}")
    notes = columnar.short_tails(table.meta or [])
    return Layout(
        "records", root, files, sizes, url, skipped=skipped, notes=notes, fmt=fmt, table=table
    )


def _under(full: str, root: str, sep: str) -> bool:
    return full.startswith(root.rstrip(sep) + sep)


def _tree(root: str, images: list[str], found: dict[str, int], url: bool) -> Layout:
    """Labels from the first folder below ``root``; see the module docstring for loose files."""
    split = posixpath if url else os.path
    folder = [_rel(root, f, url).split("/" if url else os.sep)[:-1] for f in images]
    classed = [parts[0] if parts else None for parts in folder]
    skipped: list[Skipped] = []
    if all(c is None for c in classed):  # a flat folder of images: one class
        name = split.basename(root.rstrip("/")) or "images"
        classed = [name] * len(images)
    keep = [i for i, c in enumerate(classed) if c is not None]
    skipped += [
        Skipped(images[i], "not in a class folder") for i, c in enumerate(classed) if c is None
    ]
    classes = sorted({classed[i] for i in keep})
    index = {c: k for k, c in enumerate(classes)}
    files = [images[i] for i in keep]
    return Layout(
        "tree",
        root,
        files,
        [found[f] for f in files],
        remote=url,
        labels=np.asarray([index[classed[i]] for i in keep], dtype=np.int64),
        classes=classes,
        skipped=skipped,
    )


def choose(fmt: str, where: str, name: str, images: int, tars: int) -> tuple[str, list[str]]:
    """``tree`` or ``shards`` for a place holding ``images`` images and ``tars`` shards (not
    both none), as ``fmt`` asks (``auto``: the images when there are any), and the notes to
    show; one clear error when the asked layout is not there."""
    notes: list[str] = []
    use = fmt
    if use == "auto":
        use = "tree" if images else "shards"
        if images and tars:
            notes.append(
                f"{name} holds both {images} images and {tars} tar shards: "
                "took the images (format 'shards' takes the shards)"
            )
    if use == "tree" and not images:
        raise LoaderError(f"format 'tree': no images {where} (found {tars} .tar shards)")
    if use == "shards" and not tars:
        raise LoaderError(f"format 'shards': no .tar shards {where} (found {images} images)")
    return use, notes
