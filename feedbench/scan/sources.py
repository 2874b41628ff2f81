"""Where a scan's bytes come from: a layout of the data layer (:mod:`loaders.data`), read timed.

``detect(path, fmt)`` lists the place once (:func:`loaders.data.locate`) and returns a
:class:`Source`: its units (image files, tar shards, or the samples of data files: a file, a
TFRecord record) are what is sharded across consumers, and :meth:`Source.iter_samples` yields
one :class:`~loaders.data.RawSample` per sample, each read timed on its own. Local files are read
with 1 MiB read calls (O_DIRECT, emulated latency, read-ahead hints or a reading thread as
asked); URLs through the data layer's remote readers (a data file's sample in ranged GETs of at
most 8 MiB).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from feedbench.core.errors import FeedbenchError
from feedbench.core.supervise import environ
from feedbench.scan.cache import device_read_ahead
from loaders.data import (
    FileReader,
    Layout,
    RawSample,
    StringTable,
    iter_shard,
    locate,
    locate_files,
    open_index,
    read_file,
    records,
)
from loaders.data import remote as remote_io
from loaders.data.index import listed_as
from loaders.data.saved import load_layout, save_layout
from loaders.data.tar import timed_open
from loaders.errors import LoaderError

LISTING_ENV = "FEEDBENCH_LISTING"  # the folder of the listing the parent made, for its consumers
LAYOUT_FILE, INDEX_FILE = "layout.npz", "index.npz"  # scan's listing, the loaders' index


class Source:
    """A layout listed once, with the read options of the scan (set by :meth:`set_options`)."""

    direct: bool = False  # read with O_DIRECT (no page cache)
    latency_s: float = 0.0  # emulated extra latency per file opened (slower storage)
    read_ahead: int = 0  # bytes the kernel is asked to read ahead of a shard's read position
    read_thread: bool = False  # local shards: a reading thread keeps one read call in flight
    # shards: each one's sample count by an index (scan --index), what a cut one should have held
    expected: np.ndarray | None = None

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.kind = layout.kind
        self.root = layout.root
        self.remote = layout.remote
        files = layout.files  # one buffer: no Python object per file, no copy-on-read growth
        self._files = files if isinstance(files, StringTable) else StringTable(files)
        self._sizes = np.asarray(layout.sizes, dtype=np.int64)
        labels = layout.labels if layout.labels is not None else np.zeros(0, dtype=np.int64)
        self._labels = np.asarray(labels, dtype=np.int64)
        self.classes = list(layout.classes)
        self._piece: dict[int, int] = {}  # read-ahead hint size per device, found at first open
        self.fmt = layout.fmt  # records: the record format
        self.table = layout.table  # records: where each sample lies

    def set_options(
        self,
        *,
        direct: bool = False,
        latency_s: float = 0.0,
        read_ahead: int = 0,
        read_thread: bool = False,
    ) -> None:
        self.direct, self.latency_s, self.read_ahead = direct, latency_s, read_ahead
        self.read_thread = read_thread

    def units(self) -> int:
        """Number of shardable units: files for a tree, .tar files for shards, samples for
        data files."""
        return len(self.table) if self.table is not None else len(self._files)

    def files(self) -> Sequence[str]:
        """Every file the source reads (for cache control)."""
        return self._files

    def total_bytes(self) -> int:
        return int(self._sizes.sum())

    def samples_hint(self) -> int | None:
        """Number of samples if known without reading (tree, data files, shards with an index),
        else None (shards)."""
        if self.kind == "shards":
            return None if self.expected is None else int(self.expected.sum())
        return self.units()

    def label(self, index: int) -> int:
        return int(self._labels[index]) if len(self._labels) else 0

    def sample_is_file(self) -> bool:
        """Whether each sample is a file of its own (an image, an npz), counted as a file."""
        return self.kind == "tree" or (self.kind == "records" and self.fmt in records.WHOLE_FILE)

    def iter_samples(self, unit_indices: Sequence[int], views: bool = False) -> Iterator[RawSample]:
        """Read the given units in order, one record per sample (or per failure).

        ``views=True``: a shard sample's ``data`` may be a memoryview, a data file's sample the
        process's one read buffer, valid only until the next sample is asked for (no copy out of
        a read buffer, no fresh buffer per sample); for consumers done with each sample before
        taking the next."""
        if self.kind == "tree":
            for i in unit_indices:
                yield self._read_image(str(self._files[i]), int(self._labels[i]))
            return
        if self.kind == "records":
            for i in unit_indices:
                yield self._read_record(int(i), reuse=views)
            return
        for i in unit_indices:
            path = str(self._files[i])
            reader, why = timed_open(self._open_reader, path, self.latency_s)
            if reader is None:
                yield RawSample(path, None, None, 0, 0.0, f"unreadable shard: {why}")
                continue
            yield from iter_shard(reader, path, views=views)

    def _read_image(self, path: str, label: int) -> RawSample:
        t0 = time.perf_counter()
        try:
            if self.remote:
                if self.latency_s > 0:
                    time.sleep(self.latency_s)
                data = remote_io.read_object(path)
                read_s = time.perf_counter() - t0
            else:
                data, read_s = read_file(path, direct=self.direct, latency_s=self.latency_s)
        except OSError as e:
            why = e.strerror or remote_io.one_line(e)
            prefix = "" if self.remote else "unreadable: "
            return RawSample(path, None, label, 0, time.perf_counter() - t0, prefix + why)
        error = "zero-byte file" if not data else None
        return RawSample(path, data if data else None, label, len(data), read_s, error)

    def _read_record(self, i: int, reuse: bool = False) -> RawSample:
        """Sample ``i`` of data files: one bounded read (a whole file, or a record in one);
        ``reuse``: into the process's one read buffer (see ``iter_samples``' views)."""
        table = self.table
        assert table is not None
        path = str(self._files[table.file_of[i]])
        offset, size = int(table.offset[i]), int(table.size[i])
        row = int(table.row[i]) if table.row is not None else 0
        key = path if self.fmt in records.WHOLE_FILE else f"{path}@{offset}"
        key += f"#row{row}" if table.row is not None else ""  # samples may share a row group
        t0 = time.perf_counter()
        try:
            if self.latency_s > 0:
                time.sleep(self.latency_s)
            data, _ = records.read_record(path, offset, size, url=self.remote, direct=self.direct,
                                          reuse=reuse)  # fmt: skip
        except OSError as e:
            why = e.strerror or remote_io.one_line(e)
            return RawSample(key, None, 0, 0, time.perf_counter() - t0, "unreadable: " + why)
        at = (int(table.file_of[i]), offset, row)  # what decoding needs: file, offset, row
        return RawSample(key, data, 0, len(data), time.perf_counter() - t0, None, at)

    def decode(self, raw: RawSample):
        """A data file's sample decoded as its format says (:func:`loaders.data.records.decode`),
        or a :class:`~loaders.data.records.RecordFormatError`."""
        meta = None
        if self.table is not None and self.table.meta is not None and raw.at is not None:
            meta = self.table.meta[raw.at[0]]
        _, offset, row = raw.at if raw.at is not None else (0, 0, 0)
        return records.decode(self.fmt, raw.data, raw.key, meta, offset, row)

    def _open_reader(self, path: str):
        if self.remote:
            return remote_io.StreamReader(path)
        if not self.read_ahead:  # (the hints below are the other way to overlap: not both)
            return FileReader(path, direct=self.direct, thread=self.read_thread)
        try:
            dev = os.stat(path).st_dev
        except OSError:
            dev = -1  # the open below names the problem
        piece = self._piece.get(dev)
        if piece is None:  # the most one hint makes the kernel read, per device (shards may span)
            known = max(device_read_ahead(path) or (0,))
            piece = self._piece[dev] = known if known > 0 else 128 << 10
        return FileReader(path, direct=self.direct, window=self.read_ahead, piece=piece)


def detect(
    path: str, fmt: str = "auto", progress: Callable[[int], None] | None = None
) -> tuple[Source, list[str]]:
    """The source at ``path`` and notes about the choice (e.g. a second layout left out); in a
    consumer, the listing its parent made (:func:`shared_listing`), never a listing of its own.
    ``progress(files)`` as a local folder is listed (:func:`loaders.data.locate`)."""
    shared = _shared(path, fmt)
    if shared is not None:
        return Source(shared), list(shared.notes)
    try:
        layout = locate(path, fmt, progress)
    except LoaderError as e:
        raise FeedbenchError(str(e)) from None
    return Source(layout), list(layout.notes)


def detect_files(path: str | None, progress: Callable[[int], None] | None = None) -> Source:
    """Every file at a local ``path``, for a loader that reads them its own way (the cold cache
    is applied to them); no file for no path (the loader knows its data). ``progress`` as in
    :func:`detect`."""
    if path is None:
        return Source(Layout("files", "", [], []))
    if remote_io.is_url(path):
        raise FeedbenchError("--loader reads local paths; scan the URL without --loader")
    shared = _shared(path, "files")
    if shared is not None:
        return Source(shared)
    try:
        return Source(locate_files(path, progress))
    except LoaderError as e:
        raise FeedbenchError(str(e)) from None


LISTING_PREFIX = "feedbench-listing-"
LISTING_LOCK = "owner.lock"  # flock'd by the scan that made the folder, while it runs
# A scan locks its folder microseconds after making it: one of ours still without a lock a day
# later was left by a feedbench from before the lock (be951d4), or killed in between.
LOCKLESS_STALE_S = 86400.0


@contextlib.contextmanager
def shared_listing(source: Source, path: str, fmt: str, loader: str | None = None):
    """Hand this listing to the consumer processes started meanwhile (they inherit the
    environment): N consumers then cost one listing, not N + 1 (over HTTP, asking every object's
    size again). A folder of this process's (:func:`save_listing`), removed after. Yields it.

    A scan killed outright (SIGKILL, the OOM killer) cannot remove it, and at 1.28 M files it is
    tens of MB: the folder's lock file is held while it is in use, and each scan first removes
    the folders whose lock nobody holds (:func:`sweep_listings`)."""
    sweep_listings()
    top = tempfile.mkdtemp(prefix=LISTING_PREFIX)
    folder = os.path.join(top, "listing")
    lock = None
    try:
        lock = _hold(os.path.join(top, LISTING_LOCK))
        save_listing(source, path, fmt, loader, folder)
        with environ(LISTING_ENV, folder):
            yield folder
    finally:
        shutil.rmtree(top, ignore_errors=True)
        if lock is not None:
            os.close(lock)


def _hold(path: str) -> int:
    """An exclusive flock on a new file at ``path``, held until the descriptor is closed or the
    process has ended. Locked under another name, then renamed: a sweep never finds it unlocked."""
    fd = os.open(f"{path}.new", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(f"{path}.new", path)
    return fd


def sweep_listings(tmp: str | None = None) -> int:
    """Remove the listing folders of scans that ended without removing them (their lock is
    free, or they have had none for :data:`LOCKLESS_STALE_S`); returns how many. A folder being
    made (no lock file yet), in use, or another user's is left alone."""
    removed = 0
    with contextlib.suppress(OSError), os.scandir(tmp or tempfile.gettempdir()) as entries:
        for entry in entries:
            if not entry.name.startswith(LISTING_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if st.st_uid != os.getuid():
                continue  # another user's (a shared /tmp): theirs to remove
            try:
                fd = os.open(os.path.join(entry.path, LISTING_LOCK), os.O_RDWR)
            except FileNotFoundError:
                if time.time() - st.st_mtime > LOCKLESS_STALE_S:  # no lock, ever: left over
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
                continue  # else just made: its scan takes the lock next
            except OSError:
                continue  # not ours to judge
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a scan still running
            finally:
                os.close(fd)  # (releases the lock just taken, if taken)
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def save_listing(source: Source, path: str, fmt: str, loader: str | None, folder: str) -> None:
    """The listing of ``path`` read as ``fmt`` saved in ``folder`` (made whole or not at all:
    written beside it, then renamed), for :func:`detect` in the consumers; with one of our
    loaders (``loader``: torch, dali, wds, auto), the loaders' sample index too (a shard's
    headers walked once, not once per consumer)."""
    part = f"{folder}.{os.getpid()}.part"
    os.makedirs(part)
    try:
        save_layout(source.layout, os.path.join(part, LAYOUT_FILE), listed_as(path, fmt))
        if loader is not None and source.kind in ("tree", "shards"):
            try:
                index = open_index(source.layout)
            except LoaderError as e:
                raise FeedbenchError(str(e)) from None
            index.listed = listed_as(path, fmt)
            index.save(os.path.join(part, INDEX_FILE))
        os.replace(part, folder)
    finally:
        shutil.rmtree(part, ignore_errors=True)


def shared_index() -> str | None:
    """The loaders' index file the parent made (:func:`shared_listing`), if any."""
    folder = os.environ.get(LISTING_ENV)
    target = os.path.join(folder, INDEX_FILE) if folder else None
    return target if target and os.path.isfile(target) else None


def _shared(path: str, fmt: str) -> Layout | None:
    folder = os.environ.get(LISTING_ENV)
    if not folder or not os.path.isfile(os.path.join(folder, LAYOUT_FILE)):
        return None
    try:
        return load_layout(os.path.join(folder, LAYOUT_FILE), listed_as(path, fmt))
    except LoaderError:  # the listing of another path (a consumer started for another scan)
        return None
