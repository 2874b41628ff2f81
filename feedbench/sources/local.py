"""Local (or any mounted filesystem) sources: image trees in ImageFolder layout, and tar shards."""

from __future__ import annotations

import mmap
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Iterator, Sequence

import numpy as np

from feedbench.cache import device_read_ahead
from feedbench.sources.base import RawSample, Source

_READ_CHUNK = 1 << 20
LABEL_EXTENSIONS = (".cls", ".label", ".txt")
_IMAGE_EXTS = frozenset((b"jpg", b"jpeg", b"png", b"webp"))  # member name endings, as bytes
_LABEL_EXTS = frozenset(e[1:].encode() for e in LABEL_EXTENSIONS)


def _private_map(size: int) -> mmap.mmap:
    """Anonymous memory, page-aligned (as O_DIRECT needs) and PRIVATE: Python's default for an
    anonymous map is MAP_SHARED, which a fork would share between processes reading at once
    (loader workers forked after the parent has read)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


class _Buffers:
    """One reusable 1 MiB read buffer per process (and a page-aligned one for O_DIRECT).

    Reading into the same memory every time keeps page faults out of the measurement: a fresh
    1 MiB allocation per read costs ~20 minor faults per 100 KB file, which fio does not pay.
    """

    plain: bytearray | None = None
    aligned: mmap.mmap | None = None
    rings: list[list[memoryview]] = []  # threaded readers' buffers, returned by their close()

    @classmethod
    def get(cls, direct: bool) -> memoryview:
        if direct:
            if cls.aligned is None:
                cls.aligned = _private_map(_READ_CHUNK)
            return memoryview(cls.aligned)
        if cls.plain is None:
            cls.plain = bytearray(_READ_CHUNK)
        return memoryview(cls.plain)

    @classmethod
    def take_ring(cls, k: int, size: int) -> list[memoryview]:
        """``k`` page-aligned buffers of ``size`` bytes (O_DIRECT-ready) for one threaded reader,
        reused from a closed one when they fit: a consumer reads one shard after another."""
        while cls.rings:
            ring = cls.rings.pop()
            if len(ring) == k and len(ring[0]) == size:
                return ring
        return [memoryview(_private_map(size)) for _ in range(k)]

    @classmethod
    def give_back(cls, ring: list[memoryview]) -> None:
        cls.rings.append(ring)


def read_file(path: str, *, direct: bool = False, latency_s: float = 0.0) -> tuple[bytes, float]:
    """Read a whole file in 1 MiB read calls (O_DIRECT optional); return (bytes, seconds).

    ``latency_s`` is added to every file, inside the timed read: emulated slower storage.
    """
    t0 = time.perf_counter()
    if latency_s > 0:
        time.sleep(latency_s)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        mv = _Buffers.get(direct)
        parts: list[bytes] = []
        while True:
            n = os.readv(fd, [mv])
            if n <= 0:
                break
            parts.append(bytes(mv[:n]))  # the one copy out of the reused buffer
            if direct and n < _READ_CHUNK:
                break
    finally:
        os.close(fd)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    return data, time.perf_counter() - t0


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

    def iter_samples(self, unit_indices: Sequence[int], views: bool = False) -> Iterator[RawSample]:
        for i in unit_indices:  # views: whole-file reads return their own bytes anyway
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
    """Reads a file in 1 MiB calls into a reused buffer, counting bytes and seconds of reading.

    A caller may slice views out of the buffer (``_mv[_start:_end]``: the shard walk does); one
    that keeps such a view across further reads puts it in ``hold[0]``: before the buffer is
    refilled, a held view is replaced by a copy of its bytes, so what it sees never changes.

    ``window`` > 0: after a read call, the kernel is asked (``POSIX_FADV_WILLNEED``) to have the
    next ``window`` bytes in the page cache, renewed every half window, so the disk keeps reading
    while the caller works on what it has (the read calls are unchanged; the hints' own time
    counts as reading). Linux reads at most max(read_ahead_kb, max_sectors_kb) of the device per
    hint and silently drops the rest, so the window is asked for in pieces of ``piece`` bytes.

    ``thread=True``: the reads come from a reading thread instead (see THE READING THREAD);
    ``chunk``: bytes per read call (1 MiB; tests use odd sizes).
    """

    def __init__(
        self,
        path: str,
        *,
        direct: bool = False,
        window: int = 0,
        piece: int = 128 << 10,
        thread: bool = False,
        chunk: int = _READ_CHUNK,
    ) -> None:
        self._fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        self._mv = _Buffers.get(direct) if chunk == _READ_CHUNK else memoryview(bytearray(chunk))
        self._start = self._end = 0
        self.eof = False
        self.bytes = 0
        self.seconds = 0.0
        # a view into the buffer that must outlive the next refill (a sample's image while its
        # other members are read): made a copy by the refill, only then (see _materialize)
        self.hold: list = [None]
        self._window = window
        self._piece = max(4096, piece)
        self._ahead = 0  # the end of what has been asked for
        if thread:
            self._start_thread(chunk)

    _thread: threading.Thread | None = None  # (subclasses that read otherwise have none)

    # --- THE READING THREAD (``thread=True``) --------------------------------------------------
    # One read call is always in flight while the caller parses what it has: the thread reads the
    # file in series into a ring of RING buffers and queues them; the caller hands each buffer
    # back when it asks for the next. What the caller counts as reading (``seconds``) is then the
    # time it WAITED for storage. The read calls release the GIL; the thread takes it only to
    # queue a buffer. Measured on the H200 host (2026-11-30), without it one consumer read shards
    # at 0.88 of fio: its read calls alone ran at fio's speed, the tar walk's ~14 µs a sample in
    # series with them (the kernel's own read-ahead did not overlap them there).
    RING = 3

    def _start_thread(self, chunk: int) -> None:
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self._full: queue.SimpleQueue = queue.SimpleQueue()
        self._ring = _Buffers.take_ring(self.RING, chunk)
        for buf in self._ring:
            self._free.put(buf)
        self._mv = memoryview(b"")  # the caller holds no buffer until its first refill
        self._stop = False
        self._thread = threading.Thread(target=self._read_ahead, name="feedbench-read", daemon=True)
        self._thread.start()

    def _read_ahead(self) -> None:
        fd, free, full = self._fd, self._free, self._full
        while True:
            buf = free.get()
            if self._stop:
                return
            try:
                n = os.readv(fd, [buf])
            except OSError as e:
                full.put((buf, e))
                return
            full.put((buf, n))
            if n == 0:
                return

    def _fill_from_thread(self) -> None:
        if len(self._mv):
            self._free.put(self._mv)  # the caller is done with it (held views were copied)
        if self.eof:  # the thread has ended: reading on past the end reads nothing, as readv does
            self._mv, self._start, self._end = memoryview(b""), 0, 0
            return
        t0 = time.perf_counter()
        buf, n = self._full.get()
        self.seconds += time.perf_counter() - t0
        if isinstance(n, OSError):
            self._mv, self._start, self._end = memoryview(b""), 0, 0
            self.eof = True  # the thread has ended; the caller stops on the error
            raise n
        self._mv = buf
        self.bytes += n
        self._start, self._end = 0, n
        if n == 0:
            self.eof = True

    def _materialize(self) -> None:
        held = self.hold[0]
        if type(held) is memoryview:
            self.hold[0] = bytes(held)

    def _fill(self) -> None:
        if self.hold[0] is not None:
            self._materialize()
        if self._thread is not None:
            self._fill_from_thread()
            return
        t0 = time.perf_counter()
        n = os.readv(self._fd, [self._mv])
        self.bytes += n
        self._start, self._end = 0, n
        if n == 0:
            self.eof = True
        elif self._window and self.bytes + self._window // 2 >= self._ahead:
            self._hint()
        self.seconds += time.perf_counter() - t0

    def _hint(self) -> None:
        pos, end = max(self._ahead, self.bytes), self.bytes + self._window
        while pos < end:
            os.posix_fadvise(self._fd, pos, min(self._piece, end - pos), os.POSIX_FADV_WILLNEED)
            pos += self._piece
        self._ahead = end

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the file), as a copy."""
        if n <= self._end - self._start:
            out = self._mv[self._start : self._start + n]
            self._start += n
            return bytes(out)
        parts = [bytes(self._mv[self._start : self._end])]
        need = n - len(parts[0])
        self._start = self._end
        while need > 0:
            self._fill()
            if self.eof:
                break
            take = min(need, self._end)
            parts.append(bytes(self._mv[:take]))
            self._start = take
            need -= take
        return b"".join(parts)

    def skip(self, n: int) -> int:
        """Read past ``n`` bytes without copying them; returns how many were there."""
        done = 0
        while done < n:
            if self._start == self._end:
                self._fill()
                if self.eof:
                    break
            take = min(n - done, self._end - self._start)
            self._start += take
            done += take
        return done

    def drain(self) -> None:
        """Read to the end of the file (a whole-object reader reads the tar's end padding too)."""
        self._start = self._end
        while not self.eof:
            self._fill()

    def close(self) -> None:
        if self._thread is not None:
            self._stop = True
            self._free.put(memoryview(b""))  # wakes a thread waiting for a buffer
            self._thread.join()  # at most the read call in flight
            self._thread = None
            _Buffers.give_back(self._ring)  # no read call can write into them any more
        os.close(self._fd)


class TarFormatError(Exception):
    """The shard is truncated or its headers are corrupt."""


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.rstrip(b" \0"), 8)  # the usual "0001234\0" or "012345\0 "
    except ValueError:
        pass
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _header_sum(header: bytes) -> int:
    """The ustar checksum: the unsigned sum of the header's bytes, its checksum field as 8 spaces.

    Summed by zlib's Adler-32 (component A = 1 + the sum of the bytes, modulo 65521) over pieces
    of at most 256 bytes, whose sums (≤ 65,280) never wrap: exact, and 5× faster than ``sum()``
    on bytes, which costs ~2.7 µs a header (two headers per sample).
    """
    return (
        (zlib.adler32(header[:148]) & 0xFFFF)
        + (zlib.adler32(header[156:412]) & 0xFFFF)
        + (zlib.adler32(header[412:512]) & 0xFFFF)
        - 3
        + 8 * 32
    )


def _pax_path(payload: bytes) -> tuple[str | None, int | None]:
    path, size = None, None
    for record in payload.split(b"\n"):
        _, _, kv = record.partition(b" ")
        key, _, value = kv.partition(b"=")
        if key == b"path":
            path = value.decode("utf-8", "replace")
        elif key == b"size":
            size = int(value)
    return path, size


def _text(name: str | bytes) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else name


# name, size, checksum and type flag: read from every header in one C call
_HEADER = struct.Struct("100s24x12s12x8s1s")
_ZERO_BLOCK = bytes(512)
_REGULAR = (b"0", b"\0", b"7")


class ShardSource(Source):
    """WebDataset-style tar shards: members ``key.ext`` grouped by key; label from ``key.cls``."""

    kind = "shards"

    def __init__(self, root: str, shards: Sequence[str], sizes: Sequence[int]) -> None:
        self.root = root
        self._shards = np.asarray(shards, dtype=str)
        self._sizes = np.asarray(sizes, dtype=np.int64)
        self._piece: dict[int, int] = {}  # read-ahead hint size per device, found at its first open

    def units(self) -> int:
        return len(self._shards)

    def files(self) -> Sequence[str]:
        return self._shards

    def total_bytes(self) -> int:
        return int(self._sizes.sum())

    def samples_hint(self) -> int | None:
        return None

    def iter_samples(self, unit_indices: Sequence[int], views: bool = False) -> Iterator[RawSample]:
        """With ``views``, an image's bytes may be a view into the read buffer, valid until the
        next sample is asked for: for a consumer that is done with each sample before the next
        (the scan's stages), it saves one copy of every image."""
        for i in unit_indices:
            yield from self._iter_shard(str(self._shards[i]), views)

    def _open_reader(self, path: str) -> _TimedReader:
        if not self.read_ahead:  # (the hints below are the other way to overlap: not both)
            return _TimedReader(path, direct=self.direct, thread=self.read_thread)
        try:
            dev = os.stat(path).st_dev
        except OSError:
            dev = -1  # the open below names the problem
        piece = self._piece.get(dev)
        if piece is None:  # the most one hint makes the kernel read, per device (shards may span)
            known = max(device_read_ahead(path) or (0,))
            piece = self._piece[dev] = known if known > 0 else 128 << 10
        return _TimedReader(path, direct=self.direct, window=self.read_ahead, piece=piece)

    def _iter_shard(self, path: str, views: bool = False) -> Iterator[RawSample]:
        """The shard's samples: its 512-byte tar headers walked in place, members grouped by key.

        Reads ustar, GNU long names and pax path/size records; other special members are
        skipped. A truncated stream or a header whose checksum is wrong ends the shard with one
        error record (after the good samples before it). With ``views``, an image that lies in
        the read buffer is a view into it (no copy): valid until the next sample is asked for.

        This runs in series with the read calls of a one-consumer scan (or beside its reading
        thread, which only hides it while the walk is faster than the storage), so it is one
        generator per shard (no member-level generator between it and the tar) and the common
        case is written out inline: a header lies in the read buffer (headers are 512-byte aligned,
        refills 1 MiB), its fields are unpacked in one call and checked where they lie, and a
        payload that lies in the buffer is sliced from it; anything else goes through the
        reader's methods. The image being grouped sits in ``reader.hold``, which the reader
        copies out before a refill overwrites it.
        """
        t_open = time.perf_counter()
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        try:
            reader = self._open_reader(path)
        except OSError as e:
            why = e.strerror or " ".join(str(e).split()) or type(e).__name__
            yield RawSample(path, None, None, 0, 0.0, f"unreadable shard: {why}")
            return
        reader.seconds += time.perf_counter() - t_open  # emulated latency and open() count as read
        name = os.path.basename(path)
        emit = self._emit
        hold = reader.hold  # [the sample's image: bytes, or a view into the reader's buffer]
        current: bytes | None = None  # the sample's key (UTF-8 bytes)
        label: int | None = None
        mark_bytes, mark_s = 0, 0.0
        long_name: bytes | None = None
        pax_size: int | None = None
        unpack = _HEADER.unpack_from
        error: str | None = None
        try:
            while True:
                off = reader._start
                if off == reader._end and not reader.eof:
                    reader._fill()
                    off = reader._start
                if reader._end - off >= 512:
                    buf = reader._mv
                    reader._start = off + 512
                else:  # the end of the stream (or a reader whose refills are not 512-aligned)
                    header = reader.read(512)
                    if not header:
                        break  # end of file at a member boundary: tolerated, as tarfile does
                    if len(header) < 512:
                        raise TarFormatError("truncated header")
                    buf, off = memoryview(header), 0
                name_f, size_f, sum_f, kind = unpack(buf, off)
                if name_f[0] == 0 and buf[off : off + 512] == _ZERO_BLOCK:
                    break  # end-of-archive marker
                if _octal(sum_f) != _header_sum(buf[off : off + 512]):
                    raise TarFormatError("bad header checksum")
                size = _octal(size_f)
                if pax_size is not None:
                    size, pax_size = pax_size, None
                padded = (size + 511) & ~511
                if kind in (b"L", b"x"):
                    payload = reader.read(size)
                    if len(payload) < size or reader.skip(padded - size) < padded - size:
                        raise TarFormatError("truncated extended header")
                    if kind == b"L":
                        long_name = payload.rstrip(b"\0")
                    else:
                        text, pax_size = _pax_path(payload)
                        long_name = text.encode("utf-8", "surrogateescape") if text else None
                    continue
                if long_name is not None:
                    member, long_name = long_name, None
                else:
                    member = name_f.split(b"\0", 1)[0]
                    if buf[off + 257 : off + 262] == b"ustar" and buf[off + 345] != 0:
                        prefix = bytes(buf[off + 345 : off + 500]).split(b"\0", 1)[0]
                        member = prefix + b"/" + member
                if kind not in _REGULAR:
                    if reader.skip(padded) < padded:
                        raise TarFormatError(f"truncated member {_text(member)}")
                    continue
                key, _, ext = member.rpartition(b".")
                if key != current and current is not None:
                    b, t = reader.bytes, reader.seconds
                    full = f"{name}:{current.decode('utf-8', 'replace')}"
                    yield emit(full, hold[0], label, b - mark_bytes, t - mark_s)
                    hold[0], label = None, None  # the consumer is done with that sample's view
                    mark_bytes, mark_s = b, t
                current = key
                start = reader._start
                if start + padded <= reader._end:  # payload and padding in the buffer
                    data = reader._mv[start : start + size]
                    reader._start = start + padded
                else:  # a copy: the padding's refill would overwrite a view (and a payload
                    # that spans refills is joined into new bytes anyway)
                    data = reader.read(size)
                    if len(data) < size:
                        raise TarFormatError(f"truncated member {_text(member)}")
                    if reader.skip(padded - size) < padded - size:
                        raise TarFormatError(f"truncated padding after {_text(member)}")
                if ext in _IMAGE_EXTS or ext.lower() in _IMAGE_EXTS:
                    hold[0] = data if views else bytes(data)
                elif ext.lower() in _LABEL_EXTS:
                    try:
                        label = int(bytes(data))  # int() takes ASCII digits and whitespace
                    except ValueError:
                        label = None
            reader.drain()  # the archive's end padding too, as any whole-object reader reads it
            if current is not None:
                full = f"{name}:{current.decode('utf-8', 'replace')}"
                yield emit(full, hold[0], label, reader.bytes - mark_bytes, reader.seconds - mark_s)
                hold[0] = None
        except (TarFormatError, OSError) as e:
            error = f"truncated or corrupt shard after {reader.bytes} bytes ({e})"
        finally:
            reader.close()
        if error is not None:
            yield RawSample(path, None, None, reader.bytes - mark_bytes, 0.0, error)

    @staticmethod
    def _emit(
        full: str, image: bytes | None, label: int | None, nbytes: int, seconds: float
    ) -> RawSample:
        """Sample ``full`` ("shard.tar:key"); ``nbytes`` and ``seconds``: read since the previous
        sample (headers, padding and payload of this sample)."""
        if image is None:
            return RawSample(full, None, label, nbytes, seconds, "no image member")
        if not image:
            return RawSample(full, None, label, nbytes, seconds, "zero-byte image member")
        if label is None:
            return RawSample(full, None, None, nbytes, seconds, "missing or bad label (.cls)")
        return RawSample(full, image, label, nbytes, seconds)
