"""The sample index the loader backends read: every usable sample of a layout, in numpy arrays.

Everything is listed ONCE, at build time, into numpy arrays (no per-sample Python objects, so
DataLoader workers do not grow by copy-on-read), and every backend reads the same list. Shards
are indexed by walking their headers (:mod:`loaders.data.tar`, payloads not read).

Bad input found while listing is skipped and counted in :attr:`SampleIndex.skipped`, the same way
for every backend: files without an image extension in a tree, a sample with no image or no
label, a label that is not a non-negative integer, and the tail of a truncated shard (the
samples that are complete are kept).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from loaders.data.layout import Layout, Skipped, locate
from loaders.data.readers import FileReader
from loaders.data.tar import iter_shard
from loaders.errors import LoaderError

LISTING_CHUNK = 8 << 10  # small reads between the seeks past each image, as tarfile's buffer


class StringTable:
    """Many strings in one byte buffer plus offsets: no Python object per string."""

    def __init__(self, strings: list[str]) -> None:
        encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.buffer = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.buffer[a:b].tobytes().decode("utf-8", "surrogateescape")

    def tolist(self) -> list[str]:
        return [self[i] for i in range(len(self))]


@dataclass
class SampleIndex:
    """Every sample of a source. ``kind`` is ``"tree"`` or ``"shards"``.

    Tree: ``paths[i]`` is sample i's file. Shards: sample i is ``names[i]`` inside
    ``shards[shard_of[i]]``, its image bytes at ``offset[i]`` (``size[i]`` bytes) and its label
    member at ``label_offset[i]`` (``label_size[i]`` bytes). ``labels[i]`` is its class.
    """

    kind: str
    root: str
    labels: np.ndarray  # int64 [N]
    classes: list[str]
    paths: StringTable | None = None  # tree
    shards: list[str] = field(default_factory=list)  # shards
    shard_of: np.ndarray | None = None  # int32 [N]
    offset: np.ndarray | None = None  # int64 [N]
    size: np.ndarray | None = None  # int64 [N]
    label_offset: np.ndarray | None = None
    label_size: np.ndarray | None = None
    names: StringTable | None = None  # image member name, e.g. "000123.jpg"
    skipped: list[Skipped] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def describe(self, i: int) -> str:
        """Where sample ``i`` lives, for error messages: a path, or ``shard.tar:member``."""
        if self.kind == "tree":
            assert self.paths is not None
            return self.paths[i]
        assert self.names is not None and self.shard_of is not None
        return f"{self.shards[int(self.shard_of[i])]}:{self.names[i]}"

    def read(self, i: int) -> bytes:
        """The encoded image of sample ``i`` (plain reads; the backends use their own readers)."""
        if self.kind == "tree":
            assert self.paths is not None
            with open(self.paths[i], "rb") as f:
                return f.read()
        assert self.shard_of is not None and self.offset is not None and self.size is not None
        with open(self.shards[int(self.shard_of[i])], "rb") as f:
            return os.pread(f.fileno(), int(self.size[i]), int(self.offset[i]))

    def samples_per_shard(self) -> np.ndarray:
        assert self.shard_of is not None
        return np.bincount(self.shard_of, minlength=len(self.shards)).astype(np.int64)


def open_index(source, fmt: str = "auto") -> SampleIndex:
    """Index ``source``: a path, a brace list or glob, a list of shard paths, or a
    :class:`~loaders.data.layout.Layout`. Local paths only (the backends read files)."""
    if isinstance(source, Layout):
        layout = source
    elif isinstance(source, (list, tuple)):
        paths = [os.fspath(p) for p in source]
        if not paths:
            raise LoaderError("no shards given")
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise LoaderError(
                f"shard not found: {missing[0]} ({len(missing)} of {len(paths)} missing)"
            )
        sizes = [os.path.getsize(p) for p in paths]
        layout = Layout("shards", os.path.dirname(paths[0]) or ".", paths, sizes)
    else:
        layout = locate(source, fmt)
    if layout.remote:
        scheme = layout.root.split("://", 1)[0]
        raise LoaderError(f"the loaders read local paths, not {scheme}:// URLs")
    if layout.kind == "records":
        raise LoaderError(
            f"the loaders read image trees and tar shards, not {layout.fmt} files "
            "(feedbench scan reads those)"
        )
    return _index_tree(layout) if layout.kind == "tree" else _index_shards(layout)


def _index_tree(layout: Layout) -> SampleIndex:
    assert layout.labels is not None
    return SampleIndex(
        kind="tree",
        root=layout.root,
        labels=layout.labels,
        classes=layout.classes,
        paths=StringTable(layout.files),
        skipped=list(layout.skipped),
    )


def _where(path: str, sample) -> str:
    """A listing problem's place: the shard, or ``shard:member`` (the image's name if any)."""
    if sample.key == path:
        return path  # the shard itself (unreadable or cut off)
    if sample.at is not None:
        return f"{path}:{sample.at[2]}"
    return f"{path}:{sample.key.split(':', 1)[-1]}"


def _index_shards(layout: Layout) -> SampleIndex:
    cols: dict[str, list[int]] = {k: [] for k in ("shard", "off", "size", "loff", "lsize", "lab")}
    names: list[str] = []
    skipped: list[Skipped] = list(layout.skipped)
    for s, path in enumerate(layout.files):
        try:
            reader = FileReader(path, sparse=True, chunk=LISTING_CHUNK)
        except OSError as e:
            skipped.append(Skipped(path, f"not a readable tar file ({e.strerror or e})"))
            continue
        for sample in iter_shard(reader, path, listing=True):
            if sample.error is not None:
                skipped.append(Skipped(_where(path, sample), sample.error))
                continue
            offset, size, member, label_offset, label_size = sample.at
            cols["shard"].append(s)
            cols["off"].append(offset)
            cols["size"].append(size)
            cols["loff"].append(label_offset)
            cols["lsize"].append(label_size)
            cols["lab"].append(sample.label)
            names.append(member)
    if not names:
        reason = f" ({skipped[0].path}: {skipped[0].reason})" if skipped else ""
        raise LoaderError(f"no usable samples in {len(layout.files)} shards{reason}")
    labels = np.asarray(cols["lab"], dtype=np.int64)
    return SampleIndex(
        kind="shards",
        root=layout.root,
        labels=labels,
        classes=[str(c) for c in range(int(labels.max()) + 1)],
        shards=list(layout.files),
        shard_of=np.asarray(cols["shard"], dtype=np.int32),
        offset=np.asarray(cols["off"], dtype=np.int64),
        size=np.asarray(cols["size"], dtype=np.int64),
        label_offset=np.asarray(cols["loff"], dtype=np.int64),
        label_size=np.asarray(cols["lsize"], dtype=np.int64),
        names=StringTable(names),
        skipped=skipped,
    )
