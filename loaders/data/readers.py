"""Timed sequential readers: a whole file, or a stream of 1 MiB buffers the tar walker parses.

A reader (:class:`FileReader` for a path, :class:`loaders.data.remote.StreamReader` for a URL)
exposes its current buffer for the walker to parse in place:

* ``buf`` (a memoryview), ``pos`` (next unparsed byte), ``end`` (end of valid data), ``base``
  (the file offset of ``buf[0]``); ``eof`` once a refill returned nothing;
* ``fill()`` replaces the buffer with the next bytes of the file (``pos`` = 0);
* ``read(n)`` (a copy), ``skip(n)``, ``drain()``, ``close()``;
* ``bytes`` and ``seconds``: bytes read from storage so far and the time spent reading them.

A caller may slice views out of ``buf``; one that keeps such a view across further reads puts it
in ``hold[0]``: before the buffer is refilled, a held view is replaced by a copy of its bytes, so
what it sees never changes.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
import time

READ_CHUNK = 1 << 20  # bytes per read call, as fio's 1 MiB sequential reads


def private_map(size: int) -> mmap.mmap:
    """Anonymous memory, page-aligned (as O_DIRECT needs) and PRIVATE: Python's default for an
    anonymous map is MAP_SHARED, which a fork would share between processes reading at once
    (loader workers forked after the parent has read)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


class Buffers:
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
                cls.aligned = private_map(READ_CHUNK)
            return memoryview(cls.aligned)
        if cls.plain is None:
            cls.plain = bytearray(READ_CHUNK)
        return memoryview(cls.plain)

    @classmethod
    def take_ring(cls, k: int, size: int) -> list[memoryview]:
        """``k`` page-aligned buffers of ``size`` bytes (O_DIRECT-ready) for one threaded reader,
        reused from a closed one when they fit: a consumer reads one shard after another."""
        while cls.rings:
            ring = cls.rings.pop()
            if len(ring) == k and len(ring[0]) == size:
                return ring
        return [memoryview(private_map(size)) for _ in range(k)]

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
        mv = Buffers.get(direct)
        parts: list[bytes] = []
        while True:
            n = os.readv(fd, [mv])
            if n <= 0:
                break
            parts.append(bytes(mv[:n]))  # the one copy out of the reused buffer
            if direct and n < READ_CHUNK:
                break
    finally:
        os.close(fd)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    return data, time.perf_counter() - t0


class StreamBase:
    """What every reader shares: the buffer protocol of the module docstring, over ``fill()``."""

    buf: memoryview
    pos: int
    end: int
    base: int  # file offset of buf[0]
    eof: bool
    bytes: int
    seconds: float
    hold: list

    def _init_stream(self) -> None:
        self.buf = memoryview(b"")
        self.pos = self.end = self.base = 0
        self.eof = False
        self.bytes = 0
        self.seconds = 0.0
        self.hold = [None]

    def fill(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def tell(self) -> int:
        """File offset of the next unparsed byte."""
        return self.base + self.pos

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the file), as a copy."""
        if n <= self.end - self.pos:
            out = self.buf[self.pos : self.pos + n]
            self.pos += n
            return bytes(out)
        parts = [bytes(self.buf[self.pos : self.end])]
        need = n - len(parts[0])
        self.pos = self.end
        while need > 0:
            self.fill()
            if self.eof:
                break
            take = min(need, self.end)
            parts.append(bytes(self.buf[:take]))
            self.pos = take
            need -= take
        return b"".join(parts)

    def skip(self, n: int) -> int:
        """Read past ``n`` bytes without copying them; returns how many were there."""
        done = 0
        while done < n:
            if self.pos == self.end:
                self.fill()
                if self.eof:
                    break
            take = min(n - done, self.end - self.pos)
            self.pos += take
            done += take
        return done

    def drain(self) -> None:
        """Read to the end of the file (a whole-object reader reads the tar's end padding too)."""
        self.pos = self.end
        while not self.eof:
            self.fill()

    def close(self) -> None:
        pass


class FileReader(StreamBase):
    """Reads a local file (or any mounted filesystem's) in 1 MiB calls into a reused buffer.

    ``window`` > 0: after a read call, the kernel is asked (``POSIX_FADV_WILLNEED``) to have the
    next ``window`` bytes in the page cache, renewed every half window, so the disk keeps reading
    while the caller works on what it has (the hints' own time counts as reading). Linux reads at
    most max(read_ahead_kb, max_sectors_kb) of the device per hint and silently drops the rest,
    so the window is asked for in pieces of ``piece`` bytes.

    ``thread=True``: the reads come from a reading thread instead (THE READING THREAD below).
    ``sparse=True``: :meth:`skip` seeks past whole buffers instead of reading them (listing a
    shard's members without reading its payloads). ``chunk``: bytes per read call.
    ``own_buffer=True``: a buffer of its own instead of the process's reused one (:class:`Buffers`),
    for a reader that may pause mid-file while another reads in the same process (a loader's
    stream of shards, say beside a second loader's): the reused buffer would be overwritten.
    """

    def __init__(
        self,
        path: str,
        *,
        direct: bool = False,
        window: int = 0,
        piece: int = 128 << 10,
        thread: bool = False,
        sparse: bool = False,
        chunk: int = READ_CHUNK,
        own_buffer: bool = False,
    ) -> None:
        self._init_stream()
        self._fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        if chunk == READ_CHUNK and not own_buffer:
            self.buf = Buffers.get(direct)
        elif direct:
            self.buf = memoryview(private_map(chunk))  # page-aligned, as O_DIRECT needs
        else:
            self.buf = memoryview(bytearray(chunk))
        self._buffer = self.buf
        self._window = window
        self._piece = max(4096, piece)
        self._ahead = 0  # the end of what has been asked for
        self._sparse = sparse and not thread
        self._thread: threading.Thread | None = None
        if thread:
            self._start_thread(chunk)

    # --- THE READING THREAD ---------------------------------------------------------------------
    # One read call is always in flight while the caller parses what it has: the thread reads the
    # file in series into a ring of RING buffers and queues them; the caller hands each buffer
    # back when it asks for the next. What the caller counts as reading (``seconds``) is then the
    # time it WAITED for storage. The read calls release the GIL; the thread takes it only to
    # queue a buffer. Why and what it gained: BENCHMARKS.md, "a reading thread per shard".
    RING = 3

    def _start_thread(self, chunk: int) -> None:
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self._full: queue.SimpleQueue = queue.SimpleQueue()
        self._ring = Buffers.take_ring(self.RING, chunk)
        for buf in self._ring:
            self._free.put(buf)
        self.buf = memoryview(b"")  # the caller holds no buffer until its first refill
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
        if len(self.buf):
            self._free.put(self.buf)  # the caller is done with it (held views were copied)
        self.base += self.end
        if self.eof:  # the thread has ended: reading on past the end reads nothing, as readv does
            self.buf, self.pos, self.end = memoryview(b""), 0, 0
            return
        t0 = time.perf_counter()
        buf, n = self._full.get()
        self.seconds += time.perf_counter() - t0
        if isinstance(n, OSError):
            self.buf, self.pos, self.end = memoryview(b""), 0, 0
            self.eof = True  # the thread has ended; the caller stops on the error
            raise n
        self.buf = buf
        self.bytes += n
        self.pos, self.end = 0, n
        if n == 0:
            self.eof = True

    def _materialize(self) -> None:
        held = self.hold[0]
        if type(held) is memoryview:
            self.hold[0] = bytes(held)

    def fill(self) -> None:
        if self.hold[0] is not None:
            self._materialize()
        if self._thread is not None:
            self._fill_from_thread()
            return
        t0 = time.perf_counter()
        self.base += self.end
        n = os.readv(self._fd, [self.buf])
        self.bytes += n
        self.pos, self.end = 0, n
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

    def skip(self, n: int) -> int:
        if not self._sparse or n <= self.end - self.pos:
            return super().skip(n)
        # seek: the bytes after this buffer are not read (the next fill reads from the new place)
        have = self.end - self.pos
        target = self.base + self.end + (n - have)
        size = os.fstat(self._fd).st_size
        moved = have + max(0, min(target, size) - (self.base + self.end))
        os.lseek(self._fd, min(target, size), os.SEEK_SET)
        self.base = min(target, size) - 0
        self.buf = self._buffer
        self.pos = self.end = 0
        return moved

    def close(self) -> None:
        if self._thread is not None:
            self._stop = True
            self._free.put(memoryview(b""))  # wakes a thread waiting for a buffer
            self._thread.join()  # at most the read call in flight
            self._thread = None
            Buffers.give_back(self._ring)  # no read call can write into them any more
        os.close(self._fd)
