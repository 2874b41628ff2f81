"""Local (or any mounted filesystem) sources: image trees in ImageFolder layout, and tar shards."""

from __future__ import annotations

import mmap
import os
import tarfile
import time
from collections.abc import Iterator, Sequence

import numpy as np

from feedbench.sources.base import RawSample, Source

_READ_CHUNK = 1 << 20
LABEL_EXTENSIONS = (".cls", ".label", ".txt")


def read_file(path: str, *, direct: bool = False, latency_s: float = 0.0) -> tuple[bytes, float]:
    """Read a whole file unbuffered (or with O_DIRECT); return (bytes, seconds).

    ``latency_s`` is added to every file, inside the timed read: emulated slower storage.
    """
    t0 = time.perf_counter()
    if latency_s > 0:
        time.sleep(latency_s)
    if direct:
        data = _read_direct(path)
        return data, time.perf_counter() - t0
    with open(path, "rb", buffering=0) as f:
        chunks = []
        while True:
            chunk = f.read(_READ_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    return data, time.perf_counter() - t0


def _read_direct(path: str) -> bytes:
    """Read a file with O_DIRECT (bypassing the page cache) into a page-aligned buffer."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, _READ_CHUNK)  # anonymous mappings are page-aligned, as O_DIRECT needs
        try:
            chunks = []
            while True:
                n = os.readv(fd, [buf])
                if n <= 0:
                    break
                chunks.append(buf[:n])
                if n < _READ_CHUNK:
                    break
            return b"".join(chunks)
        finally:
            buf.close()
    finally:
        os.close(fd)


class TreeSource(Source):
    """Image files under a root; the label is the index of the top-level class folder (sorted)."""

    kind = "tree"

    def __init__(self, root: str, paths: Sequence[str], sizes: Sequence[int]) -> None:
        self.root = root
        parents = sorted({os.path.dirname(p) for p in paths})
        # the folder whose sub-folders are the classes (ImageFolder's root), wherever PATH pointed
        if len(parents) > 1:
            self.label_root = os.path.commonpath(parents)
        else:
            self.label_root = os.path.dirname(parents[0]) if parents else root
        order = np.argsort(np.asarray(paths, dtype=object).astype(str), kind="stable")
        self._paths = np.asarray(paths, dtype=str)[
            order
        ]  # numpy, not a list: no copy-on-read growth
        self._sizes = np.asarray(sizes, dtype=np.int64)[order]
        classes = sorted({self._class_of(p) for p in self._paths} - {None})
        self.classes: list[str] = classes
        index = {c: i for i, c in enumerate(classes)}
        self._labels = np.array(
            [index.get(self._class_of(p), -1) for p in self._paths], dtype=np.int64
        )

    def _class_of(self, path: str) -> str | None:
        rel = os.path.relpath(path, self.label_root)
        parts = rel.split(os.sep)
        return parts[0] if len(parts) > 1 else None

    def units(self) -> int:
        return len(self._paths)

    def files(self) -> Sequence[str]:
        return self._paths

    def total_bytes(self) -> int:
        return int(self._sizes.sum())

    def samples_hint(self) -> int | None:
        return len(self._paths)

    def label(self, index: int) -> int:
        return int(self._labels[index])

    def iter_samples(self, unit_indices: Sequence[int]) -> Iterator[RawSample]:
        for i in unit_indices:
            path = str(self._paths[i])
            label = int(self._labels[i])
            try:
                data, read_s = read_file(path, direct=self.direct, latency_s=self.latency_s)
            except OSError as e:
                yield RawSample(path, None, label, 0, 0.0, f"unreadable: {e.strerror or e}")
                continue
            error = "zero-byte file" if not data else None
            yield RawSample(path, data if data else None, label, len(data), read_s, error)


class _TimedReader:
    """A file object reading 1 MiB chunks (O_DIRECT optional), counting bytes and seconds."""

    def __init__(self, path: str, *, direct: bool = False) -> None:
        flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
        self._fd = os.open(path, flags)
        self._buf = mmap.mmap(-1, _READ_CHUNK) if direct else None  # page-aligned for O_DIRECT
        self._pending = b""
        self._pos = 0
        self._eof = False
        self.bytes = 0
        self.seconds = 0.0

    def _fill(self) -> bytes:
        t0 = time.perf_counter()
        if self._buf is not None:
            n = os.readv(self._fd, [self._buf])
            chunk = self._buf[:n]
        else:
            chunk = os.read(self._fd, _READ_CHUNK)
        self.seconds += time.perf_counter() - t0
        self.bytes += len(chunk)
        if not chunk:
            self._eof = True
        return chunk

    def read(self, n: int = -1) -> bytes:
        avail = len(self._pending) - self._pos
        if 0 <= n <= avail:  # the common case: served from the current chunk, one copy
            out = self._pending[self._pos : self._pos + n]
            self._pos += n
            return out
        parts = [self._pending[self._pos :]]
        have = avail
        while not self._eof and (n < 0 or have < n):
            chunk = self._fill()
            parts.append(chunk)
            have += len(chunk)
        joined = b"".join(parts)
        if n < 0 or n >= len(joined):
            self._pending, self._pos = b"", 0
            return joined
        self._pending, self._pos = joined, n
        return joined[:n]

    def close(self) -> None:
        os.close(self._fd)
        if self._buf is not None:
            self._buf.close()


class ShardSource(Source):
    """WebDataset-style tar shards: members ``key.ext`` grouped by key; label from ``key.cls``."""

    kind = "shards"

    def __init__(self, root: str, shards: Sequence[str], sizes: Sequence[int]) -> None:
        self.root = root
        self._shards = np.asarray(shards, dtype=str)
        self._sizes = np.asarray(sizes, dtype=np.int64)

    def units(self) -> int:
        return len(self._shards)

    def files(self) -> Sequence[str]:
        return self._shards

    def total_bytes(self) -> int:
        return int(self._sizes.sum())

    def samples_hint(self) -> int | None:
        return None

    def iter_samples(self, unit_indices: Sequence[int]) -> Iterator[RawSample]:
        for i in unit_indices:
            yield from self._iter_shard(str(self._shards[i]))

    def _iter_shard(self, path: str) -> Iterator[RawSample]:
        t_open = time.perf_counter()
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        try:
            reader = _TimedReader(path, direct=self.direct)
        except OSError as e:
            yield RawSample(path, None, None, 0, 0.0, f"unreadable shard: {e.strerror or e}")
            return
        reader.seconds += time.perf_counter() - t_open  # emulated latency and open() count as read
        name = os.path.basename(path)
        current: str | None = None
        image: bytes | None = None
        label: int | None = None
        mark_bytes, mark_s = 0, 0.0
        error: str | None = None
        try:
            tar = tarfile.open(fileobj=reader, mode="r|")  # type: ignore[call-overload]  # noqa: SIM115
            for member in tar:
                if not member.isfile():
                    continue
                key, _, ext = member.name.rpartition(".")
                if key != current and current is not None:
                    yield self._emit(name, current, image, label, reader, mark_bytes, mark_s)
                    mark_bytes, mark_s = reader.bytes, reader.seconds
                    image, label = None, None
                current = key
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else b""
                ext = ext.lower()
                if ext in ("jpg", "jpeg", "png", "webp"):
                    image = data
                elif "." + ext in LABEL_EXTENSIONS:
                    try:
                        label = int(data.decode().strip())
                    except ValueError:
                        label = None
            # read the archive's end padding too, as any whole-object reader does
            while reader.read(_READ_CHUNK):
                pass
            if current is not None:
                yield self._emit(name, current, image, label, reader, mark_bytes, mark_s)
        except (tarfile.TarError, OSError, EOFError) as e:
            error = f"truncated or corrupt shard after {reader.bytes} bytes ({e})"
        finally:
            reader.close()
        if error is not None:
            yield RawSample(path, None, None, reader.bytes - mark_bytes, 0.0, error)

    @staticmethod
    def _emit(
        shard: str,
        key: str,
        image: bytes | None,
        label: int | None,
        reader: _TimedReader,
        mark_bytes: int,
        mark_s: float,
    ) -> RawSample:
        # bytes and time since the previous sample: headers, padding and payload of this sample
        nbytes, seconds = reader.bytes - mark_bytes, reader.seconds - mark_s
        full = f"{shard}:{key}"
        if image is None:
            return RawSample(full, None, label, nbytes, seconds, "no image member")
        if not image:
            return RawSample(full, None, label, nbytes, seconds, "zero-byte image member")
        if label is None:
            return RawSample(full, None, None, nbytes, seconds, "missing or bad label (.cls)")
        return RawSample(full, image, label, nbytes, seconds)
