"""Cold-cache control: evict files from the page cache and measure how much of them is resident."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass
class Residency:
    """Pages of a set of files that sit in the page cache (None where the OS would not say)."""

    resident_bytes: int
    total_bytes: int
    files_unknown: int = 0

    @property
    def fraction(self) -> float:
        return self.resident_bytes / self.total_bytes if self.total_bytes else 0.0


def file_residency(path: str) -> tuple[int, int] | None:
    """(resident bytes, file bytes) of one file via mmap + mincore; None if it cannot be told."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            return None
        try:
            pages = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                return None
            resident = sum(b & 1 for b in bytes(vec))
        finally:
            _libc.munmap(addr, size)
        return min(resident * _PAGE, size), size
    finally:
        os.close(fd)


def residency(paths: Iterable[str]) -> Residency:
    out = Residency(0, 0)
    for path in paths:
        r = file_residency(str(path))
        if r is None:
            out.files_unknown += 1
            continue
        out.resident_bytes += r[0]
        out.total_bytes += r[1]
    return out


def evict(paths: Iterable[str], beat: Callable[[], None] | None = None) -> int:
    """Drop each file's pages from the page cache (posix_fadvise DONTNEED). Returns failures.

    Works for clean pages on local filesystems and most network mounts; a filesystem that ignores
    the advice shows up in :func:`residency` afterwards, which is how callers check it worked.
    """
    failures = 0
    for path in paths:
        if beat is not None:
            beat()
        try:
            fd = os.open(str(path), os.O_RDONLY)
        except OSError:
            failures += 1
            continue
        # dirty pages (a file just written) cannot be dropped: flush them first. This writes
        # nothing new: it only makes the page cache's copy match what is already on disk. Some
        # filesystems refuse fsync on a read-only descriptor; advise anyway.
        with contextlib.suppress(OSError):
            os.fdatasync(fd)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            failures += 1
        finally:
            os.close(fd)
    return failures


def warm(paths: Iterable[str], chunk: int = 1 << 20, beat: Callable[[], None] | None = None) -> int:
    """Read every file once so its pages are cached. Returns bytes read."""
    total = 0
    for path in paths:
        if beat is not None:
            beat()
        try:
            with open(str(path), "rb", buffering=0) as f:
                while data := f.read(chunk):
                    total += len(data)
        except OSError:
            continue
    return total


def drop_all_caches() -> bool:
    """Write 3 to /proc/sys/vm/drop_caches (root only). Returns whether it was done."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def device_read_ahead(path: str) -> tuple[int, int] | None:
    """(read-ahead, largest request) in bytes of the block device under ``path``, from sysfs
    (``queue/read_ahead_kb``, ``queue/max_sectors_kb``; a partition's are its disk's), or None
    where there is no block device to ask (network, FUSE or overlay filesystems)."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for queue in (f"{base}/queue", f"{base}/../queue"):
        try:
            with open(f"{queue}/read_ahead_kb") as f:
                ra = int(f.read()) * 1024
            with open(f"{queue}/max_sectors_kb") as f:
                request = int(f.read()) * 1024
            return ra, request
        except (OSError, ValueError):
            continue
    return None
