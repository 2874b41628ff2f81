"""TFRecord framing, read and written without TensorFlow.

A TFRecord file is a sequence of records, each framed as (TensorFlow's
``tensorflow/core/lib/io/record_writer.h``)::

    uint64 length            little-endian
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

with ``masked_crc(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2³²) over CRC-32C
(Castagnoli). The payload is usually a ``tf.train.Example`` protocol buffer; it is returned as
bytes, not parsed.

:func:`index_records` lists where each record lies by reading only the 12-byte headers (the
payloads are seeked past), so records can be sharded across ranks one by one.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import BinaryIO

from loaders.errors import LoaderError

HEADER = 12  # length (8) + its masked CRC (4)
FOOTER = 4  # the data's masked CRC
_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<QI")
_U64 = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class RecordFormatError(LoaderError):
    """A record whose framing or checksum is wrong, or a file that ends inside a record."""


def _crc32c():
    try:
        import crc32c
    except ImportError as e:  # a core dependency: only a broken install gets here
        raise LoaderError("TFRecord checksums need crc32c: pip install crc32c") from e
    return crc32c.crc32c


def masked_crc(data) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = _crc32c()(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record as it lies in the file."""
    length = _U64.pack(len(data))
    return length + _CRC.pack(masked_crc(length)) + data + _CRC.pack(masked_crc(data))


def write_records(f: BinaryIO, payloads) -> int:
    """Write every payload as a record; returns the bytes written."""
    n = 0
    for data in payloads:
        framed = frame(data)
        f.write(framed)
        n += len(framed)
    return n


def record_length(header, where: str) -> int:
    """The payload length a 12-byte record header gives, its CRC checked."""
    length, crc = _LENGTH.unpack_from(header)
    if crc != masked_crc(bytes(header[:8])):
        raise RecordFormatError(f"{where}: bad length checksum")
    return length


def parse_record(framed, where: str = "record", *, verify: bool = True) -> memoryview:
    """The payload of one framed record (header, data, footer), its checksums checked."""
    view = memoryview(framed)
    if len(view) < HEADER + FOOTER:
        raise RecordFormatError(f"{where}: {len(view)} bytes is shorter than a record's frame")
    length = record_length(view[:HEADER], where)
    if HEADER + length + FOOTER != len(view):
        raise RecordFormatError(
            f"{where}: the header says {length} bytes of data, the record holds "
            f"{len(view) - HEADER - FOOTER}"
        )
    data = view[HEADER : HEADER + length]
    if verify and _CRC.unpack_from(view, HEADER + length)[0] != masked_crc(data):
        raise RecordFormatError(f"{where}: bad data checksum")
    return data


def index_records(
    read_at: Callable[[int, int], bytes], size: int, where: str
) -> tuple[list[int], list[int], str | None]:
    """Offsets and framed sizes of the records of a ``size``-byte file, read through
    ``read_at(offset, n)``; and why the listing stopped early (a cut-off or corrupt record:
    the records before it are kept), or None."""
    offsets: list[int] = []
    sizes: list[int] = []
    pos = 0
    while pos < size:
        header = read_at(pos, HEADER)
        if len(header) < HEADER:
            return offsets, sizes, f"{where}: cut off inside a record header at byte {pos}"
        try:
            length = record_length(header, f"{where} at byte {pos}")
        except RecordFormatError as e:
            return offsets, sizes, str(e)
        framed = HEADER + length + FOOTER
        if pos + framed > size:
            return offsets, sizes, f"{where}: cut off inside the record at byte {pos}"
        offsets.append(pos)
        sizes.append(framed)
        pos += framed
    return offsets, sizes, None
