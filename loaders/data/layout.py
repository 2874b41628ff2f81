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
* A local folder is listed in one pass (``os.scandir``, sizes from the same entries, one sort).
  Links are followed, but each folder is listed once: a link back to a folder above it, or a
  second way to one folder, is left out and named in ``skipped``, as are unreadable folders and
  files, broken links and anything that is not a regular file.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterator
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


def locate(
    path: str | os.PathLike[str], fmt: str = "auto", progress: Callable[[int], None] | None = None
) -> Layout:
    """The layout at ``path`` (see the module docstring), or one clear :class:`LoaderError`.
    ``progress(files)``: told the files found so far after each local folder listed (a tree of
    a million files takes a while), or each URL of a brace list asked its size, for the caller
    to show."""
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
        return _pattern(text, url, fmt, progress)
    return _place(text, fmt) if url else _folder(text, fmt, progress)


def _shards(root: str, paths: list[str], sizes: list[int], url: bool) -> Layout:
    return Layout("shards", root, paths, sizes, remote=url)


def _sizes(
    paths: list[str], url: bool, what: str = "file", progress: Callable[[int], None] | None = None
) -> dict[str, int]:
    """Each named file's size (one ``stat`` each, a HEAD each over HTTP); a local file that is
    not there is one clear error."""
    if url:
        return dict(zip(paths, remote.sizes(paths, progress), strict=True))
    found: dict[str, int] = {}
    missing: list[str] = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            missing.append(p)
        else:
            found[p] = st.st_size
    if missing:
        raise LoaderError(
            f"{what} not found: {missing[0]} ({len(missing)} of {len(paths)} missing)"
        )
    return found


def _pattern(
    pattern: str, url: bool, fmt: str, progress: Callable[[int], None] | None = None
) -> Layout:
    shown = remote.redact_url(pattern)
    paths = patterns.expand(pattern)
    if not paths:
        raise LoaderError(f"no files match {shown}")
    kinds = {records.format_of(_path_part(p)) for p in paths}
    if _is_record(fmt) or (fmt == "auto" and len(kinds) == 1 and None not in kinds):
        found = _sizes(paths, url, progress=progress)
        return _records(_parent(paths[0]), found, fmt if fmt != "auto" else kinds.pop(), url)
    if not all(is_shard(_path_part(p)) for p in paths):
        raise LoaderError(f"a pattern must name .tar shards or data files of one format: {shown}")
    if url:
        return _shards(_parent(paths[0]), paths, remote.sizes(paths, progress), True)
    found = _sizes(paths, False, "shard")
    return _shards(_parent(paths[0]), paths, [found[p] for p in paths], False)


def _path_part(item: str) -> str:
    return item.split("?", 1)[0] if remote.is_url(item) else item


def _parent(path: str) -> str:
    return (path.rsplit("/", 1)[0] if remote.is_url(path) else os.path.dirname(path)) or "."


def _folder(path: str, fmt: str, progress: Callable[[int], None] | None = None) -> Layout:
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
    found, left_out = _walk(path, progress)
    if not found and left_out:
        raise LoaderError(f"nothing readable in {path}: {_left_out(left_out)}")
    layout = _classify(path, found, fmt, url=False)
    layout.skipped[:0] = left_out  # first: a folder left out may hold many samples
    return layout


def _left_out(skipped: list[Skipped]) -> str:
    return f"{len(skipped)} left out, e.g. {skipped[0].path} ({skipped[0].reason})"


def _walk(
    path: str, progress: Callable[[int], None] | None = None
) -> tuple[dict[str, int], list[Skipped]]:
    """Every file under the folder ``path`` (dot-files and dot-folders left out) → its size,
    sorted by path, and what could not be listed (:class:`_Walk`)."""
    if not os.access(path, os.R_OK | os.X_OK):
        raise LoaderError(f"permission denied: {path}")
    walk = _Walk(path, progress)
    walk.run()
    walk.found.sort()  # the one sort: (path, size) pairs, paths unique
    walk.skipped.sort()  # (few) in path order, whichever round found them
    return dict(walk.found), walk.skipped


class _Walk:
    """One pass over a folder: each directory read once with ``os.scandir``, sizes from the same
    entries. Links are followed, but a directory is visited once, keyed by (device, inode): the
    real folders first, then the links in sorted order, so that a link to a folder already listed
    (a loop back to its parent, a second link) is named in ``skipped`` instead of listed again.
    Unreadable folders and files are named there too."""

    def __init__(self, root: str, progress: Callable[[int], None] | None = None) -> None:
        self.root = root
        self.progress = progress  # told the files found after each folder
        self.found: list[tuple[str, int]] = []
        self.skipped: list[Skipped] = []
        top = os.stat(root)
        self.seen: dict[tuple[int, int], str] = {(top.st_dev, top.st_ino): root}
        self.links: list[tuple[str, tuple[int, int]]] = []  # links to folders, for later
        self.euid = os.geteuid() if hasattr(os, "geteuid") else -1

    def run(self) -> None:
        self._tree(self.root)
        while self.links:  # links found in linked folders are taken in the next round
            batch, self.links = sorted(self.links), []
            for link, key in batch:
                first = self.seen.get(key)
                if first is None:
                    self.seen[key] = link
                    self._tree(link)
                elif link.startswith(first.rstrip(os.sep) + os.sep):  # below its own target
                    self.skipped.append(Skipped(link, "symbolic link loop"))
                else:
                    self.skipped.append(Skipped(link, f"already listed as {first}"))

    def _tree(self, top: str) -> None:
        """The folders below ``top`` that are not links, depth first, without recursion."""
        stack = [top]
        while stack:
            stack += self._folder(stack.pop())
            if self.progress is not None:
                self.progress(len(self.found))

    def _folder(self, folder: str) -> list[str]:
        """List one folder's files; returns its subfolders (links to folders are kept aside)."""
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError as e:
            self.skipped.append(Skipped(folder, f"unreadable folder ({_why(e)})"))
            return []
        subfolders: list[str] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                st = entry.stat()  # follows a link: its target's kind and size
            except OSError as e:
                broken = entry.is_symlink() and e.errno == errno.ENOENT
                why = "broken symbolic link" if broken else f"unreadable ({_why(e)})"
                self.skipped.append(Skipped(entry.path, why))
                continue
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if entry.is_symlink():
                    self.links.append((entry.path, key))
                elif key in self.seen:  # a bind mount, or a folder a link reached first
                    self.skipped.append(Skipped(entry.path, f"already listed as {self.seen[key]}"))
                else:
                    self.seen[key] = entry.path
                    subfolders.append(entry.path)
            elif not stat.S_ISREG(st.st_mode):
                self.skipped.append(Skipped(entry.path, "not a regular file"))
            elif self._readable(entry.path, st.st_mode):
                self.found.append((entry.path, st.st_size))
            else:
                self.skipped.append(Skipped(entry.path, "unreadable (Permission denied)"))
        return subfolders

    def _readable(self, path: str, mode: int) -> bool:
        # read for everyone (or root) needs no system call; ACLs are the rare case the read
        # itself then reports
        if self.euid == 0 or mode & 0o444 == 0o444:
            return True
        return os.access(path, os.R_OK, effective_ids=os.access in os.supports_effective_ids)


def _why(e: OSError) -> str:
    return "symbolic link loop" if e.errno == errno.ELOOP else (e.strerror or str(e))


def locate_files(
    path: str | os.PathLike[str], progress: Callable[[int], None] | None = None
) -> Layout:
    """Every file at a local ``path`` (one file, or all under a folder) as kind ``files``: the
    data of a loader that reads it its own way (Parquet, LMDB, ...), for cache control only.
    ``progress`` as in :func:`locate`."""
    text = os.fspath(path)
    if remote.is_url(text):
        raise LoaderError(f"a local path is needed here, not a URL: {remote.redact_url(text)}")
    if not os.path.exists(text):
        raise LoaderError(f"no such file or directory: {text}")
    if os.path.isfile(text):
        found, left_out = {text: os.path.getsize(text)}, []
    else:
        found, left_out = _walk(text, progress)
    if not found:
        more = f": {_left_out(left_out)}" if left_out else ""
        raise LoaderError(f"{text} is empty: no files in it{more}")
    root = os.path.dirname(text) if os.path.isfile(text) else text
    return Layout("files", root or ".", list(found), list(found.values()), skipped=left_out)


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


def _rels(root: str, paths: list[str], url: bool) -> Iterator[str]:
    """Each path below ``root``: every listed path starts with its root, so slicing is exact
    (os.path.relpath would make two absolute paths per file)."""
    cut = len(root)
    if url:  # (a URL's listing may repeat its slashes)
        return (p[cut:].lstrip("/") for p in paths)
    cut += 0 if root.endswith(os.sep) else len(os.sep)
    return (p[cut:] for p in paths)


def _join(root: str, name: str, sep: str) -> str:
    return root + name if root.endswith(sep) else root + sep + name


class _Sorted(NamedTuple):
    """The files found under a root, sorted out in one pass (each list sorted by path)."""

    images: list[str]
    tars: list[str]
    others: list[str]
    other_rels: list[str]  # the others' paths below the root
    sample_root: bool  # images all in images/, shards all in shards/


def _sort_out(root: str, found: dict[str, int], url: bool) -> _Sorted:
    sep = "/" if url else os.sep
    tree, shards = SAMPLE_TREE + sep, SAMPLE_SHARDS + sep
    out = _Sorted([], [], [], [], True)
    sample_root = True
    paths = sorted(found)  # linear on a walk's or a listing's paths, already sorted
    for f, r in zip(paths, _rels(root, paths, url), strict=True):
        image, tar = is_image(r), is_shard(r)
        if image:
            out.images.append(f)
            sample_root = sample_root and r.startswith(tree)
        if tar:
            out.tars.append(f)
            sample_root = sample_root and r.startswith(shards)
        if not (image or tar):
            out.others.append(f)
            out.other_rels.append(r)
    return out._replace(sample_root=sample_root)


def _classify(root: str, found: dict[str, int], fmt: str, *, url: bool) -> Layout:
    """Images, shards and other files found under ``root`` → the layout ``fmt`` asks for."""
    shown = remote.redact_url(root)
    sep = "/" if url else os.sep
    if not found:
        raise LoaderError(f"{shown} is empty: no files in it")
    if _is_record(fmt):
        return _records(root, found, fmt, url)
    images, tars, others, other_rels, sample_root = _sort_out(root, found, url)
    if not images and not tars:
        kinds = {records.format_of(r) for r in other_rels} - {None}
        if fmt == "auto" and len(kinds) == 1:
            return _records(root, found, kinds.pop(), url)
        raise LoaderError(
            f"no images ({', '.join(IMAGE_EXTENSIONS)}) or .tar shards in {shown} "
            f"({len(others)} other files, e.g. {other_rels[0]}); data files are read when "
            "all are of one format (.npy, .npz, .tfrecord, .h5, .parquet), any file with "
            "--format files"
        )
    use, notes = choose(fmt, f"in {shown}", shown, len(images), len(tars))
    if use == "shards":
        folder = _join(root, SAMPLE_SHARDS, sep) if sample_root and tars else root
        return Layout("shards", folder, tars, [found[t] for t in tars], url, notes=notes)
    tree_root = _join(root, SAMPLE_TREE, sep) if sample_root else root
    layout = _tree(tree_root, images, found, url)
    layout.notes = notes
    below = tree_root if tree_root.endswith(sep) else tree_root + sep
    layout.skipped += [
        Skipped(f, "not an image file (extension)") for f in others if f.startswith(below)
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
    files: list[str] = []
    skipped: list[Skipped] = []
    for f in sorted(found):  # one pass: each file is taken or left out
        if exts is None or _path_part(f).lower().endswith(exts):
            files.append(f)
        else:
            skipped.append(Skipped(f, f"not a {fmt} file (extension)"))
    if not files:
        raise LoaderError(
            f"format {fmt!r}: no {'/'.join(exts or ())} files in {shown} "
            f"(found {len(found)} other files)"
        )
    sizes = [found[f] for f in files]
    if url and not any(sizes):  # index pages carry no sizes: ask the server (HEAD)
        sizes = remote.sizes(files)
    table, left_out = records.build_table(fmt, files, sizes, url, option)
    skipped += [Skipped(f, why) for f, why in left_out]
    if not len(table):
        reason = f" ({skipped[-1].path}: {skipped[-1].reason})" if skipped else ""
        raise LoaderError(f"format {fmt!r}: no samples in {len(files)} files in {shown}{reason}")
    notes = columnar.short_tails(table.meta or [])
    return Layout(
        "records", root, files, sizes, url, skipped=skipped, notes=notes, fmt=fmt, table=table
    )


def _tree(root: str, images: list[str], found: dict[str, int], url: bool) -> Layout:
    """Labels from the first folder below ``root``; see the module docstring for loose files."""
    split = posixpath if url else os.path
    sep = "/" if url else os.sep
    # the first folder below the root, or None for an image lying in the root
    classed: list[str | None] = []
    for r in _rels(root, images, url):
        head, slash, _ = r.partition(sep)
        classed.append(head if slash else None)
    if all(c is None for c in classed):  # a flat folder of images: one class
        name = split.basename(root.rstrip("/")) or "images"
        classed = [name] * len(images)
    classes = sorted({c for c in classed if c is not None})
    index = {c: k for k, c in enumerate(classes)}
    files = [f for f, c in zip(images, classed, strict=True) if c is not None]
    loose = [
        Skipped(f, "not in a class folder")
        for f, c in zip(images, classed, strict=True)
        if c is None
    ]
    return Layout(
        "tree",
        root,
        files,
        [found[f] for f in files],
        remote=url,
        labels=np.fromiter((index[c] for c in classed if c is not None), np.int64, len(files)),
        classes=classes,
        skipped=loose,
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
