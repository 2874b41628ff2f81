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

import hashlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from loaders.data import remote, saved
from loaders.data.layout import Layout, Skipped, locate
from loaders.data.redaction import secret_parts, unmask
from loaders.data.tar import iter_shard
from loaders.errors import LoaderError

LISTING_CHUNK = 8 << 10  # small reads between the seeks past each image, as tarfile's buffer
REMOTE_LISTING_STREAMS = 16  # remote shards listed at once (as remote.sizes' HEAD requests)


class StringTable:
    """Many strings in one byte buffer plus offsets: no Python object per string."""

    def __init__(self, strings: Sequence[str]) -> None:
        encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.buffer = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    @classmethod
    def from_arrays(cls, buffer: np.ndarray, offsets: np.ndarray) -> StringTable:
        """A table over existing arrays (a saved index's, mapped from its file)."""
        if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[-1]) != len(buffer):
            raise ValueError("string offsets do not match their buffer")
        table = cls.__new__(cls)
        table.buffer, table.offsets = buffer, offsets
        return table

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        if not -len(self) <= i < len(self):
            raise IndexError(f"string {i} of {len(self)}")
        i = i % len(self)
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.buffer[a:b].tobytes().decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes + self.offsets.nbytes)

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
    listed: str = ""  # what was listed (path or URL, and format): a saved index is checked by it

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def nbytes(self) -> int:
        """Bytes its per-sample arrays hold (the small fields left out)."""
        arrays = [self.labels, self.shard_of, self.offset, self.size, self.label_offset]
        arrays.append(self.label_size)
        tables = [t.nbytes for t in (self.paths, self.names) if t is not None]
        return sum(a.nbytes for a in arrays if a is not None) + sum(tables)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this index to ``path`` (atomically), to be reused by :meth:`load`: by the other
        ranks of a job, or by later jobs over the same data (:mod:`loaders.data.saved`).

        URLs are saved without their credentials (a password, a signature or token in the
        query: :func:`~loaders.data.redaction.redact_url`): an index is kept and passed around,
        the secrets stay with whoever names the source; :meth:`load` given it puts them back."""
        shown = [remote.redact_url(s) for s in self.shards]
        masked = remote.redact_url(self.root) != self.root or shown != self.shards
        paths = self.paths
        if paths is not None and remote.is_url(self.root):  # (a local tree has no URL)
            given = paths.tolist()
            shown_paths = [remote.redact_url(p) for p in given]
            if shown_paths != given:
                paths, masked = StringTable(shown_paths), True
        header = {"listing": "samples", "listed": self.listed, "kind": self.kind, "masked": masked}
        header |= {"root": remote.redact_url(self.root), "classes": self.classes, "shards": shown}
        header["skipped"] = [[remote.redact_text(t) for t in s] for s in self.skipped]
        arrays = {"labels": self.labels}
        for name in _ARRAYS:
            if getattr(self, name) is not None:
                arrays[name] = getattr(self, name)
        for name, table in (("paths", paths), ("names", self.names)):
            if table is not None:
                arrays[name + ".buffer"], arrays[name + ".offsets"] = table.buffer, table.offsets
        saved.write(path, header, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str], source=None) -> SampleIndex:
        """The index :meth:`save` wrote to ``path``, its arrays mapped from the file (forked
        workers share the pages); one :class:`LoaderError` for a file that is not one.
        ``source``: the path, URL or shard list it indexes, as given to :func:`open_index`,
        whose credentials are put back into its URLs (saved without them)."""
        header, arrays = saved.read(path)
        if header.get("listing") != "samples":
            where = os.fspath(path)
            raise LoaderError(f"{where} is not a loader's index (it holds a scan's listing)")
        try:
            index = _from_saved(header, arrays)
        except (KeyError, TypeError, ValueError) as e:
            raise LoaderError(f"{os.fspath(path)} is a damaged feedbench index ({e})") from None
        if header.get("masked") and isinstance(source, (str, os.PathLike, list, tuple)):
            _unmask(index, source)
        return index

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def remote(self) -> bool:
        """Whether the samples are read over the network (s3://, http(s)://)."""
        return remote.is_url(self.root)

    def describe(self, i: int) -> str:
        """Where sample ``i`` lives, for error messages: a path, or ``shard.tar:member`` (a URL
        without its credentials)."""
        if self.kind == "tree":
            assert self.paths is not None
            return remote.redact_url(self.paths[i])
        assert self.names is not None and self.shard_of is not None
        return f"{remote.redact_url(self.shards[int(self.shard_of[i])])}:{self.names[i]}"

    def describe_shard(self, s: int) -> str:
        """Shard ``s``'s path or URL as it may be shown (no credentials)."""
        return remote.redact_url(self.shards[s])

    def read(self, i: int) -> bytes:
        """The encoded image of sample ``i``: a whole file or object, or its bytes in a shard
        (one read; over a URL one GET, ranged for a shard's member). OSError if it cannot."""
        if self.kind == "tree":
            assert self.paths is not None
            return remote.read_sample(self.paths[i])
        assert self.shard_of is not None and self.offset is not None and self.size is not None
        shard = self.shards[int(self.shard_of[i])]
        return remote.read_sample(shard, int(self.offset[i]), int(self.size[i]))

    def samples_per_shard(self) -> np.ndarray:
        assert self.shard_of is not None
        return np.bincount(self.shard_of, minlength=len(self.shards)).astype(np.int64)


def _unmask(index: SampleIndex, source) -> None:
    """The credentials :meth:`SampleIndex.save` left out of the index's URLs, put back from
    ``source`` (given again by its user): shards named one by one, each by its own URL; else
    the source URL's password and secret query values, wherever they were masked."""
    listed = isinstance(source, (list, tuple))
    given = [os.fspath(s) for s in source] if listed else [os.fspath(source)]
    pairs = secret_parts(given[0]) if given else []
    if listed:
        real = {remote.redact_url(s): s for s in given}
        index.shards = [real.get(s, s) for s in index.shards]
    else:
        index.shards = [unmask(s, pairs) for s in index.shards]
    index.root = unmask(index.root, pairs)
    if index.paths is not None and pairs:
        index.paths = StringTable([unmask(p, pairs) for p in index.paths])


_ARRAYS = ("shard_of", "offset", "size", "label_offset", "label_size")
_TABLES = ("paths", "names")


def _from_saved(header: dict, arrays: dict[str, np.ndarray]) -> SampleIndex:
    """A :class:`SampleIndex` from a saved file's parts, its lengths checked."""
    index = SampleIndex(
        kind=header["kind"],
        root=header["root"],
        labels=arrays["labels"],
        classes=list(header["classes"]),
        shards=list(header["shards"]),
        skipped=[Skipped(str(p), str(r)) for p, r in header["skipped"]],
        listed=str(header["listed"]),
    )
    for name in _ARRAYS:
        setattr(index, name, arrays.get(name))
    for name in _TABLES:
        if name + ".buffer" in arrays:
            table = StringTable.from_arrays(arrays[name + ".buffer"], arrays[name + ".offsets"])
            setattr(index, name, table)
    n = len(index.labels)
    wanted = ["paths"] if index.kind == "tree" else ["names", *_ARRAYS]
    if index.kind not in ("tree", "shards"):
        raise ValueError(f"unknown kind {index.kind!r}")
    for name in wanted:
        part = getattr(index, name)
        if part is None or len(part) != n:
            raise ValueError(f"{name} does not hold one entry per sample")
    return index


def listed_as(source, fmt: str = "auto") -> str:
    """What an index of ``source`` read as ``fmt`` is recorded as having listed: a local path
    made absolute (the same folder named two ways is one source), a URL without credentials."""
    if isinstance(source, (list, tuple)):  # (a digest: 100 k shards named one by one)
        names = "\n".join(listed_as(p, "shards") for p in source).encode("utf-8", "replace")
        return f"{len(source)} shards named one by one, sha1 {hashlib.sha1(names).hexdigest()}"
    text = os.fspath(source)
    shown = remote.redact_url(text) if remote.is_url(text) else os.path.abspath(text)
    return f"{shown} ({fmt})"


def open_index(source, fmt: str = "auto") -> SampleIndex:
    """Index ``source``: a path or URL (``s3://``, ``http(s)://``), a brace list or glob, a
    list of shard paths, or a :class:`~loaders.data.layout.Layout`.

    Remote shards are listed by streaming each one once (the headers are walked, the payloads
    read past: the whole shard crosses the network), 16 at a time. On many ranks, or for a large
    dataset, list once and hand the index over: ``open_index(url).save(path)`` on one machine,
    then ``build_loader(url, index=path)`` (or ``SampleIndex.load(path)``) on every rank."""
    if isinstance(source, Layout):
        layout = source
    elif isinstance(source, (list, tuple)):
        layout = _listed_shards([os.fspath(p) for p in source])
    else:
        layout = locate(source, fmt)
    if layout.kind == "records":
        raise LoaderError(
            f"the loaders read image trees and tar shards, not {layout.fmt} files "
            "(feedbench scan reads those)"
        )
    index = _index_tree(layout) if layout.kind == "tree" else _index_shards(layout)
    if not isinstance(source, Layout):
        index.listed = listed_as(source, fmt)
    return index


def _listed_shards(paths: list[str]) -> Layout:
    """Shards named one by one: local paths, or URLs (all of one kind)."""
    if not paths:
        raise LoaderError("no shards given")
    urls = [remote.is_url(p) for p in paths]
    if any(urls) and not all(urls):
        raise LoaderError("shards must be all local paths or all URLs, not a mix")
    if all(urls):
        for p in paths:
            remote.check_protocol(p)
        return Layout("shards", paths[0].rsplit("/", 1)[0], paths, remote.sizes(paths), remote=True)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise LoaderError(f"shard not found: {missing[0]} ({len(missing)} of {len(paths)} missing)")
    sizes = [os.path.getsize(p) for p in paths]
    return Layout("shards", os.path.dirname(paths[0]) or ".", paths, sizes)


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
    shown = remote.redact_url(path)
    if sample.key == path:
        return shown  # the shard itself (unreadable or cut off)
    if sample.at is not None:
        return f"{shown}:{sample.at[2]}"
    return f"{shown}:{sample.key.split(':', 1)[-1]}"


def _list_one(path: str) -> list | OSError:
    """A shard's listing records (:func:`iter_shard` with ``listing``), or why it could not be
    opened. Locally the payloads are seeked past; over a URL the stream reads through them."""
    try:
        reader = remote.open_reader(path, sparse=True, chunk=LISTING_CHUNK)
    except OSError as e:
        return e
    return list(iter_shard(reader, path, listing=True))


def _list_shards(layout: Layout):
    """Every shard's listing, in order: remote shards 16 at a time (each one a stream that
    waits on the network), local ones one after another (the disk's seeks do not overlap)."""
    if not layout.remote:
        yield from map(_list_one, layout.files)
        return
    with ThreadPoolExecutor(max_workers=REMOTE_LISTING_STREAMS) as pool:
        yield from pool.map(_list_one, layout.files)  # each taken in order as it is done


def _index_shards(layout: Layout) -> SampleIndex:
    cols: dict[str, list[int]] = {k: [] for k in ("shard", "off", "size", "loff", "lsize", "lab")}
    names: list[str] = []
    skipped: list[Skipped] = list(layout.skipped)
    for s, (path, listed) in enumerate(zip(layout.files, _list_shards(layout), strict=True)):
        if isinstance(listed, OSError):
            # a store that cannot be reached says nothing of the shard: stop with its reason
            unreachable = remote.transport_error(path, listed)
            if unreachable is not None:
                raise unreachable from None
            why = remote.reason(listed)
            skipped.append(Skipped(remote.redact_url(path), f"not a readable tar file ({why})"))
            continue
        for sample in listed:
            if sample.error is not None:
                skipped.append(Skipped(_where(path, sample), remote.redact_text(sample.error)))
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
