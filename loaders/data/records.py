"""Data files that are not images: where their samples lie, reading them, decoding them.

A *record format* turns a list of files into a :class:`RecordTable`, one row per sample: the
file it lies in, its byte offset and its size. A sample is then one bounded read (in read calls
of at most ``chunk`` bytes; over a URL, ranged GETs), so the same table is read from a disk,
``s3://`` or ``http(s)://``; and samples are sharded across ranks one by one, whatever file
they lie in.

* ``files``: any file is a sample, read as raw bytes (no decode);
* ``npy`` / ``npz``: a ``.npy`` / ``.npz`` file is a sample; decode = ``numpy.load`` (every
  array of an npz);
* ``tfrecord``: a record of a ``.tfrecord`` file is a sample (:mod:`loaders.data.tfrecord`);
  decode = its framing and both checksums checked;
* ``hdf5`` / ``parquet``: a row of a dataset / a row group, or N rows with ``parquet:rows=N``
  (:mod:`loaders.data.columnar`).
"""

from __future__ import annotations

import io
import math
import os
import time
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from loaders.data import columnar, remote, tfrecord
from loaders.data.readers import READ_CHUNK, read_file
from loaders.data.tfrecord import RecordFormatError
from loaders.errors import LoaderError

RECORD_FORMATS = ("files", "npy", "npz", "tfrecord", "hdf5", "parquet")
EXTENSIONS = {
    "npy": (".npy",),
    "npz": (".npz",),
    "tfrecord": (".tfrecord", ".tfrecords"),
    "hdf5": (".h5", ".hdf5"),
    "parquet": (".parquet",),
}
WHOLE_FILE = ("files", "npy", "npz")  # a sample is a whole file
INDEX_CHUNK = 64 << 10  # a remote TFRecord's headers are listed through blocks of this size


def format_of(name: str) -> str | None:
    """The record format a file name's extension says (``files`` takes any: never said)."""
    low = name.split("?", 1)[0].lower()
    return next((f for f, exts in EXTENSIONS.items() if low.endswith(exts)), None)


def split_format(fmt: str) -> tuple[str, str | None]:
    """``"hdf5:/images"`` → ``("hdf5", "/images")``: a format and its option (the HDF5 dataset
    to read, ``rows=N`` for Parquet), or None."""
    base, sep, option = fmt.partition(":")
    return base, (option if sep else None)


def check_option(base: str, option: str | None) -> bool:
    """Whether format ``base`` takes an option (hdf5, parquet); a bad Parquet one is one clear
    error here, before any file is listed."""
    if base == "parquet":
        columnar.parquet_rows(option)
    return option is None or base in ("hdf5", "parquet")


def has_decode(fmt: str) -> bool:
    return fmt != "files"


@dataclass
class RecordTable:
    """Sample i lies in ``files[file_of[i]]`` at ``offset[i]``, ``size[i]`` bytes (numpy
    arrays: no Python object per sample)."""

    file_of: np.ndarray  # int32 [N]
    offset: np.ndarray  # int64 [N]
    size: np.ndarray  # int64 [N]
    meta: list[dict | None] | None = None  # per file, what decoding needs (hdf5, parquet)
    row: np.ndarray | None = None  # int64 [N], parquet:rows=N: the sample's first row in its file

    def __len__(self) -> int:
        return len(self.file_of)


def build_table(
    fmt: str, files: list[str], sizes: list[int], url: bool, option: str | None = None
) -> tuple[RecordTable, list[tuple[str, str]]]:
    """The samples of ``files`` in format ``fmt``, and the (file, reason) of what was left out
    (a zero-byte or unreadable file, a cut-off or corrupt TFRecord tail, an HDF5 file without a
    contiguous dataset). ``option``: the HDF5 dataset to read (default: the largest), or
    Parquet's ``rows=N``."""
    file_of: list[int] = []
    offset: list[int] = []
    size: list[int] = []
    meta: list[dict | None] = []
    row: list[int] = []
    skipped: list[tuple[str, str]] = []
    for k, (path, nbytes) in enumerate(zip(files, sizes, strict=True)):
        meta.append(None)
        if nbytes <= 0:
            skipped.append((path, "zero-byte file"))
            continue
        try:
            offs, lens, meta[k], why = _index_file(fmt, path, nbytes, url, option)
        except OSError as e:
            skipped.append((path, f"unreadable: {remote.reason(e)}"))
            continue
        if why:
            skipped.append((path, why))
        file_of += [k] * len(offs)
        if meta[k] is not None and meta[k].get("rows"):  # parquet:rows=N: sample j from row j·N
            row += range(0, len(offs) * meta[k]["rows"], meta[k]["rows"])
        offset += offs
        size += lens
    table = RecordTable(
        np.asarray(file_of, dtype=np.int32),
        np.asarray(offset, dtype=np.int64),
        np.asarray(size, dtype=np.int64),
        meta if any(m is not None for m in meta) else None,
        np.asarray(row, dtype=np.int64) if row else None,
    )
    return table, skipped


def _remote_opener(path: str):
    return remote.filesystem(path).open(path, "rb", block_size=INDEX_CHUNK, cache_type="readahead")


def _index_file(fmt: str, path: str, nbytes: int, url: bool, option: str | None):
    """``(offsets, sizes, meta, why)`` of one file's samples; a transport or library error
    as an OSError."""
    if fmt in WHOLE_FILE:
        return [0], [nbytes], None, None
    opener = _remote_opener if url else None
    try:
        if fmt == "tfrecord":
            offs, lens, why = _index_tfrecord(path, nbytes, opener)
            return offs, lens, None, why
        if fmt == "hdf5":
            return columnar.index_hdf5(path, opener, dataset=option)
        return columnar.index_parquet(path, nbytes, opener, columnar.parquet_rows(option))
    except LoaderError:
        raise
    except Exception as e:  # noqa: BLE001 - a file h5py or pyarrow cannot open: left out
        raise remote.as_oserror(e) from e


def _index_tfrecord(path: str, nbytes: int, opener):
    name = path.rstrip("/").rsplit("/", 1)[-1]
    with opener(path) if opener is not None else open(path, "rb", buffering=0) as f:

        def read_at(pos: int, n: int) -> bytes:
            f.seek(pos)
            return f.read(n)

        return tfrecord.index_records(read_at, nbytes, name)


class _Reused:
    """This process's one read buffer for ``reuse=True`` reads, grown as needed."""

    buf = np.empty(0, dtype=np.uint8)

    @classmethod
    def get(cls, size: int) -> np.ndarray:
        if len(cls.buf) < size:
            cls.buf = np.empty(size, dtype=np.uint8)
        return cls.buf[:size]


def read_range(
    path: str, offset: int, size: int, *, chunk: int = READ_CHUNK, reuse: bool = False
) -> tuple[np.ndarray, int]:
    """``size`` bytes of a local file from ``offset``, in read calls of at most ``chunk``
    bytes into one buffer (uint8, not zero-filled first: a bytearray's zero fill cost 0.11 s
    of a 146 MB sample's 0.33 s read and decode); returns the buffer and the read calls.
    ``reuse``: the process's one buffer, valid until its next such read (a fresh 146 MB
    buffer per sample is page-faulted in, and the kernel zeroes every page first)."""
    buf = _Reused.get(size) if reuse else np.empty(size, dtype=np.uint8)
    view = memoryview(buf)
    done = calls = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while done < size:
            n = os.preadv(fd, [view[done : done + min(chunk, size - done)]], offset + done)
            calls += 1
            if n <= 0:
                raise OSError(f"file ended after {done} of the {size} bytes listed")
            done += n
    finally:
        os.close(fd)
    return buf, calls


def read_record(
    path: str, offset: int, size: int, *, url: bool, direct: bool = False, chunk: int = 0,
    reuse: bool = False,
) -> tuple[bytes, float]:  # fmt: skip
    """One sample's bytes (a whole file when ``offset`` is 0 and ``size`` its size) and the
    seconds it took; ``chunk``: the most bytes per read call or ranged GET (0: the default,
    1 MiB locally, 8 MiB over a URL); ``reuse``: locally, into the process's one read buffer,
    valid until its next reused read (for callers done with a sample before the next)."""
    t0 = time.perf_counter()
    if url:
        data, _ = remote.read_range(path, offset, size, chunk=chunk or remote.S3_BLOCK)
    elif direct:  # O_DIRECT needs aligned offsets: whole files only (checked by the caller)
        data, _ = read_file(path, direct=True)
    else:
        data, _ = read_range(path, offset, size, chunk=chunk or READ_CHUNK, reuse=reuse)
    return data, time.perf_counter() - t0


def decode(fmt: str, data, where: str, meta: dict | None = None, offset: int = 0, row: int = 0):
    """The decoded sample: arrays for npy / npz, the payload for a TFRecord record, a row for
    HDF5, an Arrow table for a Parquet row group or N rows from ``row`` (``meta``: its file's,
    from the table)."""
    if fmt == "tfrecord":
        return tfrecord.parse_record(data, where)
    if fmt in ("hdf5", "parquet"):
        if meta is None:
            raise RecordFormatError(f"{where}: {fmt} decoding needs its file's metadata")
        try:
            if fmt == "hdf5":
                return columnar.decode_hdf5(data, meta)
            return columnar.decode_parquet(data, meta, offset, row)
        except (ValueError, OSError) as e:
            raise RecordFormatError(f"{where}: not a readable {fmt} sample ({e})") from None
    try:
        if fmt == "npy":
            return npy_array(memoryview(data))
        if fmt == "npz":
            return npz_arrays(memoryview(data))
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise RecordFormatError(f"{where}: not a readable .{fmt} file ({e})") from None
    raise RecordFormatError(f"{where}: format {fmt!r} has no decode step")


# --- npy / npz from a buffer: numpy.load's work after its reads, no more ----------------------


_PIECE = 1 << 18  # bytes copied (and checked) at a time: numpy.load's own piece size


class _View(io.RawIOBase):
    """A seekable file over a buffer, each read one copy of just the bytes asked for (a
    BytesIO over a bytearray copies the whole buffer first)."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.view)}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        end = len(self.view) if n is None or n < 0 else min(len(self.view), self.pos + n)
        out = bytes(self.view[self.pos : end])
        self.pos = max(self.pos, end)
        return out


def npy_array(view: memoryview, crc: int | None = None) -> np.ndarray:
    """The array of a ``.npy`` held in ``view``, copied out once, in pieces that stay in the CPU
    cache while ``crc`` (an npz member's CRC-32 over all of ``view``) is checked on the way."""
    header = io.BytesIO(view[: 1 << 16].tobytes())
    version = np.lib.format.read_magic(header)
    fmt = np.lib.format
    read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, fortran, dtype = read_header(header)
    if dtype.hasobject:
        raise ValueError("object arrays need pickle, which is not allowed")
    start, nbytes = header.tell(), math.prod(shape) * dtype.itemsize
    if start + nbytes > len(view):
        raise ValueError("the array is cut off")
    out = np.empty(nbytes, dtype=np.uint8)
    check = zlib.crc32(view[:start]) if crc is not None else 0
    for at in range(start, start + nbytes, _PIECE):
        piece = view[at : min(at + _PIECE, start + nbytes)]
        if crc is not None:
            check = zlib.crc32(piece, check)
        out[at - start : at - start + len(piece)] = piece
    if crc is not None and zlib.crc32(view[start + nbytes :], check) != crc:
        raise zipfile.BadZipFile("bad CRC-32")
    order = "F" if fortran else "C"
    return out.view(dtype).reshape(shape, order=order)


def npz_arrays(view: memoryview) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` held in ``view``, with what ``numpy.load`` does after reading
    the file: each member's CRC-32 checked, its array copied out once. Through
    ``np.load(io.BytesIO(data))`` this took 2.5x the CPU of ``np.load(path)`` on 146 MB npz files
    (the buffer copied whole, then in pieces, then into the array). Compressed members are
    inflated by zipfile."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(_View(view)) as zf:
        for info in zf.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                with zf.open(info) as f:
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
                continue
            at = info.header_offset
            local = bytes(view[at : at + 30])
            if local[:4] != b"PK\x03\x04":
                raise zipfile.BadZipFile(f"{info.filename}: no local header")
            start = at + 30 + int.from_bytes(local[26:28], "little")
            start += int.from_bytes(local[28:30], "little")
            member = view[start : start + info.compress_size]
            if len(member) != info.file_size:
                raise zipfile.BadZipFile(f"{info.filename}: cut off")
            out[name] = npy_array(member, crc=info.CRC)
    return out
